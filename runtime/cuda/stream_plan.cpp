#include "runtime/cuda/stream_plan.hpp"

#include <algorithm>

#include "runtime/cuda/lowering.hpp"
#include "runtime/plan/update_branches.hpp"

namespace sg::cuda {
namespace {

bool shares(const std::vector<ValueId>& a, const std::vector<ValueId>& b) {
  return std::any_of(a.begin(), a.end(), [&](ValueId v) { return std::find(b.begin(), b.end(), v) != b.end(); });
}

// Whether `later` must wait for `earlier`: it reads what earlier writes or
// updates, or it writes or updates what earlier reads, writes or updates.
bool depends_on(const Launch& later, const Launch& earlier) {
  if (shares(later.reads, earlier.writes) || shares(later.reads, earlier.updates)) return true;
  for (const auto* touched : {&earlier.reads, &earlier.writes, &earlier.updates})
    if (shares(later.writes, *touched) || shares(later.updates, *touched)) return true;
  return false;
}

bool any(const std::vector<bool>& v) { return std::find(v.begin(), v.end(), true) != v.end(); }

}  // namespace

bool StreamPlan::forks() const { return any(on_communication); }

bool StreamPlan::splits_gradients() const { return any(on_gradient_stream); }

std::vector<std::size_t> StreamPlan::joined_before(std::size_t index) const {
  std::vector<std::size_t> out;
  for (std::size_t c = 0; c < on_communication.size(); ++c)
    if ((on_communication[c] || on_gradient_stream[c]) && join_before[c] == index) out.push_back(c);
  return out;
}

std::vector<std::size_t> StreamPlan::forked_before(std::size_t index) const {
  std::vector<std::size_t> out;
  for (std::size_t g = 0; g < on_gradient_stream.size(); ++g)
    if (on_gradient_stream[g] && fork_before[g] == index) out.push_back(g);
  return out;
}

StreamPlan plan_streams(const sg::Graph&, const Schedule& s, const std::vector<bool>& on_communication,
                        const std::vector<bool>& on_gradient_stream) {
  const std::size_t n = s.launches.size();
  StreamPlan plan;
  plan.on_communication = on_communication;
  plan.on_gradient_stream = on_gradient_stream.empty() ? std::vector<bool>(n, false) : on_gradient_stream;
  plan.fork_before.assign(n, 0);
  plan.join_before.assign(n, n);
  // Gradient-stream launches keep their schedule order on their stream, so
  // each forks no earlier than the one before it.
  std::size_t earliest = 0;
  for (std::size_t g = 0; g < n; ++g) {
    if (!plan.on_gradient_stream[g]) continue;
    std::size_t fork = earliest;
    for (std::size_t j = 0; j < g; ++j)
      if (plan.on_step_stream(j) && depends_on(s.launches[g], s.launches[j])) fork = std::max(fork, j + 1);
    plan.fork_before[g] = earliest = fork;
  }
  for (std::size_t c = 0; c < n; ++c) {
    if (plan.on_step_stream(c)) continue;
    for (std::size_t j = c + 1; j < n; ++j)
      if (plan.on_step_stream(j) && depends_on(s.launches[j], s.launches[c])) {
        plan.join_before[c] = j;
        break;
      }
  }
  return plan;
}

StreamPlan plan_streams(const sg::Graph& graph, const Schedule& s, bool weight_gradient_stream) {
  std::vector<bool> on_communication;
  for (const Launch& l : s.launches)
    on_communication.push_back(cuda_lowering_of(l).launch_stream() == LaunchStream::communication);
  std::vector<bool> on_gradient_stream;
  if (weight_gradient_stream && !any(on_communication)) on_gradient_stream = update_branch_launches(graph, s);
  return plan_streams(graph, s, on_communication, on_gradient_stream);
}

void keep_live_until_joined(ArenaRequest& request, const Schedule& s, const StreamPlan& plan) {
  if (s.launches.empty()) return;
  const int last_launch = static_cast<int>(s.launches.size()) - 1;
  for (std::size_t c = 0; c < s.launches.size(); ++c) {
    if (plan.on_step_stream(c)) continue;
    const int from = plan.on_gradient_stream[c] ? static_cast<int>(plan.fork_before[c]) : static_cast<int>(c);
    const int until = std::min(static_cast<int>(plan.join_before[c]), last_launch);
    const Launch& l = s.launches[c];
    for (const auto* ids : {&l.reads, &l.writes, &l.updates, &l.scratch})
      for (ValueId id : *ids)
        if (const int slot = request.buffer_of_value[static_cast<std::size_t>(id)]; slot >= 0) {
          auto& b = request.buffers[static_cast<std::size_t>(slot)];
          b.first = std::min(b.first, from);
          b.last = std::max(b.last, until);
        }
  }
}

}  // namespace sg::cuda
