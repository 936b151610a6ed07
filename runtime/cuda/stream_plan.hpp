#pragma once
// Which stream each launch of a step runs on, and where the step's stream
// forks to the communication stream and joins back (issue 25).
//
// A launch whose lowering says it communicates (CudaLowering::launch_stream:
// the gradient all-reduce) runs on the program's second stream. It is forked
// where it sits in the schedule: an event recorded on the step's stream just
// before its place, which the communication stream waits for, so everything
// it reads has been written. The step's stream waits for it (its own event,
// recorded on the communication stream after it) right before the first
// later launch that depends on it: one that reads what it writes, or writes
// or updates what it reads or writes; with none, at the end of the step.
// The launches in between overlap it. CUDA-graph capture records the fork
// and join as graph edges (cudaEventRecord + cudaStreamWaitEvent across
// streams inside one capture), so a replay overlaps the same way.
//
// The memory plan assumes launches run one after another, so every arena
// buffer a communication launch reads or writes is kept live until its join:
// no launch that may run beside it reuses those bytes.
//
// A schedule without communication launches gets an empty plan: the program
// records its launches on the one stream exactly as before.
#include <cstddef>
#include <vector>

#include "runtime/plan/memory_plan.hpp"
#include "runtime/plan/schedule.hpp"

namespace sg::cuda {

struct StreamPlan {
  std::vector<bool> on_communication;  // per launch
  // join_before[c]: for communication launch c, the launch before which the
  // step's stream waits for it (launches.size(): at the end of the step);
  // unused for the others.
  std::vector<std::size_t> join_before;
  bool forks() const;  // any launch on the communication stream
  // The communication launches the step's stream waits for right before
  // launch `index` (index == launches.size(): at the end of the step).
  std::vector<std::size_t> joined_before(std::size_t index) const;
};

// From each launch's own answer (tests pass one) ...
StreamPlan plan_streams(const sg::Graph& graph, const Schedule& schedule, const std::vector<bool>& on_communication);
// ... or from the CUDA lowerings' launch_stream().
StreamPlan plan_streams(const sg::Graph& graph, const Schedule& schedule);

// Keeps every arena buffer a communication launch reads or writes live until
// its join (see above); call between arena_request and plan_memory.
void keep_live_until_joined(ArenaRequest& request, const Schedule& schedule, const StreamPlan& plan);

}  // namespace sg::cuda
