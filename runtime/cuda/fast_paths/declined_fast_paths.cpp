// Why each fast path without a launch in a schedule declined the graph
// (issue 35): its record's why_not, else whether any part of the graph
// fits its lowerings at all. CPU-side: no lowering here asks the device
// unless one is present.
#include <algorithm>
#include <exception>
#include <functional>
#include <set>
#include <stdexcept>
#include <string>

#include "runtime/cuda/fast_paths/fast_path.hpp"

namespace sg::cuda {
namespace {

// Whether any unit of a fresh cover of `graph` matches one of `lowerings`;
// lowerings that ask the device are skipped without one.
bool some_unit_fits(const sg::Graph& graph, const std::vector<SlottedLowering>& lowerings, bool device_present,
                    bool& skipped_device) {
  const Cover cover(graph);
  for (const SlottedLowering& l : lowerings) {
    if (!device_present && l.lowering->asks_device()) {
      skipped_device = true;
      continue;
    }
    for (const CoverUnit& unit : cover.units()) {
      try {
        if (l.lowering->match(cover, unit)) return true;
      } catch (const std::exception&) {  // a pattern that expects more of the graph: not a fit
      }
    }
  }
  return false;
}

std::string reason_for(const FastPath& record, const sg::Graph& graph, const BackendOptions& options,
                       bool device_present) {
  std::string why;
  try {
    why = record.why_not(graph, options, device_present);
  } catch (const std::exception& e) {
    // Without a GPU: a check that asks the device (shared memory per block).
    if (!device_present) return "not decided without a GPU: it asks the device whether the step fits";
    return std::string("its check failed: ") + e.what();
  }
  if (!why.empty()) return why;
  const auto lowerings = record.lowerings(options);
  if (lowerings.empty()) return "its options turn all of its kernels off";
  bool skipped_device = false;
  if (some_unit_fits(graph, lowerings, device_present, skipped_device))
    return "not chosen: a higher-priority lowering took its nodes";
  if (skipped_device) return "not decided without a GPU: its kernels ask the device whether they fit";
  return "no part of the graph fits its kernels (ops, dtypes or shapes)";
}

}  // namespace

const FastPath& fast_path_named(std::string_view name) {
  for (const FastPath& record : fast_paths())
    if (record.name == name) return record;
  throw std::out_of_range("no fast path named " + std::string(name));
}

std::vector<bool> record_launches(const FastPath& record, const sg::Graph& graph, const Schedule& schedule,
                                  const BackendOptions& options) {
  std::set<std::string, std::less<>> names;  // its lowerings'
  if (!record.took)
    for (const SlottedLowering& l : record.lowerings(options)) names.insert(std::string(l.lowering->name()));
  std::vector<bool> out;
  for (const Launch& l : schedule.launches)
    out.push_back(record.took ? record.took(graph, l, options) : names.count(l.lowering->name()) > 0);
  return out;
}

std::vector<DeclinedFastPath> declined_fast_paths(const sg::Graph& graph, const Schedule& schedule,
                                                  const BackendOptions& options, bool device_present) {
  std::vector<DeclinedFastPath> declined;
  for (const FastPath& record : fast_paths()) {
    if (options.core_only) {
      declined.push_back({record.name, "backend.core_only is set: the core lowerings alone"});
      continue;
    }
    const std::vector<bool> taken = record_launches(record, graph, schedule, options);
    if (std::find(taken.begin(), taken.end(), true) == taken.end())
      declined.push_back({record.name, reason_for(record, graph, options, device_present)});
  }
  return declined;
}

}  // namespace sg::cuda
