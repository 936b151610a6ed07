#include "runtime/cuda/stream_plan.hpp"

#include <algorithm>

#include "runtime/cuda/lowering.hpp"

namespace sg::cuda {
namespace {

bool shares(const std::vector<ValueId>& a, const std::vector<ValueId>& b) {
  return std::any_of(a.begin(), a.end(), [&](ValueId v) { return std::find(b.begin(), b.end(), v) != b.end(); });
}

// Whether `later` must wait for `comm`: it reads what comm writes or
// updates, or it writes or updates what comm reads, writes or updates.
bool depends_on(const Launch& later, const Launch& comm) {
  if (shares(later.reads, comm.writes) || shares(later.reads, comm.updates)) return true;
  for (const auto* touched : {&comm.reads, &comm.writes, &comm.updates})
    if (shares(later.writes, *touched) || shares(later.updates, *touched)) return true;
  return false;
}

}  // namespace

bool StreamPlan::forks() const { return std::find(on_communication.begin(), on_communication.end(), true) != on_communication.end(); }

std::vector<std::size_t> StreamPlan::joined_before(std::size_t index) const {
  std::vector<std::size_t> out;
  for (std::size_t c = 0; c < on_communication.size(); ++c)
    if (on_communication[c] && join_before[c] == index) out.push_back(c);
  return out;
}

StreamPlan plan_streams(const sg::Graph&, const Schedule& s, const std::vector<bool>& on_communication) {
  StreamPlan plan;
  plan.on_communication = on_communication;
  plan.join_before.assign(s.launches.size(), s.launches.size());
  for (std::size_t c = 0; c < s.launches.size(); ++c) {
    if (!on_communication[c]) continue;
    for (std::size_t j = c + 1; j < s.launches.size(); ++j)
      if (!on_communication[j] && depends_on(s.launches[j], s.launches[c])) {
        plan.join_before[c] = j;
        break;
      }
  }
  return plan;
}

StreamPlan plan_streams(const sg::Graph& graph, const Schedule& s) {
  std::vector<bool> on_communication;
  for (const Launch& l : s.launches)
    on_communication.push_back(cuda_lowering_of(l).launch_stream() == LaunchStream::communication);
  return plan_streams(graph, s, on_communication);
}

void keep_live_until_joined(ArenaRequest& request, const Schedule& s, const StreamPlan& plan) {
  if (s.launches.empty()) return;
  const int last_launch = static_cast<int>(s.launches.size()) - 1;
  for (std::size_t c = 0; c < s.launches.size(); ++c) {
    if (!plan.on_communication[c]) continue;
    const int until = std::min(static_cast<int>(plan.join_before[c]), last_launch);
    const Launch& l = s.launches[c];
    for (const auto* ids : {&l.reads, &l.writes, &l.updates})
      for (ValueId id : *ids)
        if (const int slot = request.buffer_of_value[static_cast<std::size_t>(id)]; slot >= 0) {
          auto& b = request.buffers[static_cast<std::size_t>(slot)];
          b.last = std::max(b.last, until);
        }
  }
}

}  // namespace sg::cuda
