#pragma once
// Which stream each launch of a step runs on, where it forks from the step's
// stream and where the step's stream joins it back.
//
// Two kinds of launches leave the step's stream:
// - A launch whose lowering says it communicates (CudaLowering::launch_stream:
//   the gradient all-reduce, issue 25) runs on the communication stream. It
//   is forked where it sits in the schedule: an event recorded on the step's
//   stream just before its place, which the communication stream waits for,
//   so everything it reads has been written. With `communication_stream`
//   off it stays on the step's stream where it sits (an A/B of the overlap).
// - Without communication, the launches on an update branch (weight and bias
//   gradients and the updates: runtime/plan/update_branches.hpp) run on the
//   gradient stream when `weight_gradient_stream` asks for it. Each is
//   forked as early as it may run: right after the last earlier launch of
//   the step's stream that it depends on (fork_before), and not before an
//   earlier gradient-stream launch it depends on; so a layer's weight
//   gradient runs beside its data gradient and the layers below. The
//   gradient stream runs them in the order of their forks (schedule order
//   among those forked at one place): a launch waiting for the end of the
//   chain does not hold back a later one that is ready.
// - Both at once (a data-parallel rank): the weight gradients run on the
//   gradient stream as in a single process, and an all-reduce that reads
//   them also waits for their `done` events (waits_for). The all-reduce and
//   the launches that read what it writes (the updates) stay off the
//   gradient stream: there an update would wait for its all-reduce and hold
//   back the weight gradients forked after it. (The plan from explicit
//   per-launch answers still handles a gradient-stream launch after an
//   all-reduce: it waits for the all-reduce's `done` event.)
// - With `independent_launch_stream`, a launch that depends on no earlier
//   launch of the step (the parameters' f16/bf16 casts, which read only
//   state the previous step left) also runs on the gradient stream, forked
//   at the step's start: the casts run beside the batch fetch instead of
//   after it. The schedule's first launch stays on the step's stream. A
//   launch that computes from the parameters alone (the filters'
//   channels-last copies: graph/filter_layout_pass.hpp) runs on the gradient
//   stream as well, forked right after the launch it depends on (the casts)
//   as a weight gradient is, and joined before its first reader (the
//   convolution).
// - With two gradient streams (`gradient_streams: 2`, or 0 in a single
//   process) the gradient stream is two streams (lanes).
//   Among the launches forked at one place, one that depends on an earlier
//   one there continues on that one's lane (the latest such: a bias's
//   reshape, then its column sums), and the heads of those chains alternate
//   between the lanes in schedule order (a layer's weight gradient on one,
//   its bias's column sums on the other). A lane runs its launches in fork
//   order; a launch that depends on one in the other lane waits for its
//   `done` event (waits_for), as the communication stream's all-reduces do
//   for the gradients they read in either lane. By default (`gradient_streams:
//   0`) a data-parallel rank keeps one lane (two are not yet measured on
//   GPUs); `gradient_streams: 2` gives a rank two.
// - A gradient-stream launch that would fork after the step's stream has
//   run its last launch stays on the step's stream: nothing runs beside it
//   there, and it does not queue behind the gradient stream's backlog (the
//   first layer's weight gradient, after the chain's last launch, starts as
//   soon as the chain ends, beside the other layers' gradients and updates).
// The step's stream waits for a side launch (its own event, recorded after
// it) right before the first later launch of the step's stream that depends
// on it: one that reads what it writes, or writes or updates what it reads or
// writes; with none, at the end of the step. CUDA-graph capture records the
// forks and joins as graph edges (cudaEventRecord + cudaStreamWaitEvent
// across streams inside one capture), so a replay overlaps the same way.
//
// The memory plan assumes launches run one after another, so every arena
// buffer a side launch reads or writes is kept live from its fork to its
// join (keep_live_until_joined): no launch that may run beside it reuses
// those bytes.
//
// A schedule with neither gets an empty plan: the program records its
// launches on the one stream exactly as before.
#include <cstddef>
#include <vector>

#include "runtime/backend_options.hpp"
#include "runtime/plan/memory_plan.hpp"
#include "runtime/plan/schedule.hpp"

namespace sg::cuda {

struct StreamPlan {
  std::vector<bool> on_communication;     // per launch
  std::vector<bool> on_gradient_stream;   // per launch
  std::vector<int> gradient_lane;         // per launch: which gradient stream (0 or 1); 0 for the rest
  // fork_before[g]: for gradient-stream launch g, the index of the launch of
  // the step's stream before which it is enqueued (<= g); unused for the
  // rest. The gradient stream runs its launches in (fork_before, index) order.
  std::vector<std::size_t> fork_before;
  // join_before[c]: for side launch c, the launch before which the step's
  // stream waits for it (launches.size(): at the end of the step); unused for
  // the others.
  std::vector<std::size_t> join_before;
  // waits_for[c]: for side launch c, the earlier launches of the OTHER side
  // streams it depends on (the communication stream, the other gradient
  // lane); it waits for their `done` events before it runs. (Each is forked
  // before c: a communication launch forks where it sits, a gradient-stream
  // launch forks after any communication launch it depends on and no earlier
  // than a gradient-stream launch it depends on.) Empty for the rest.
  std::vector<std::vector<std::size_t>> waits_for;
  bool forks() const;             // any launch on the communication stream
  bool splits_gradients() const;  // any launch on the gradient stream
  int gradient_lanes() const;     // how many gradient streams the launches use (0 when none)
  bool on_step_stream(std::size_t index) const { return !on_communication[index] && !on_gradient_stream[index]; }
  // The side launches the step's stream waits for right before launch
  // `index` (index == launches.size(): at the end of the step).
  std::vector<std::size_t> joined_before(std::size_t index) const;
  // The gradient-stream launches enqueued right before launch `index`, in schedule order.
  std::vector<std::size_t> forked_before(std::size_t index) const;
};

// From each launch's own answer (tests pass them; an empty on_gradient_stream: none), over
// `gradient_streams` lanes (1 or 2) ...
StreamPlan plan_streams(const sg::Graph& graph, const Schedule& schedule, const std::vector<bool>& on_communication,
                        const std::vector<bool>& on_gradient_stream = {}, int gradient_streams = 1);
// ... or from the CUDA lowerings' launch_stream(), the update branches and
// the independent launches, as the options ask.
StreamPlan plan_streams(const sg::Graph& graph, const Schedule& schedule, const BackendOptions& options);

// Per launch: whether it does something and depends on no earlier launch
// (never the first: it has nothing to run beside).
std::vector<bool> independent_launches(const Schedule& schedule);

// Per launch: whether everything it reads and writes is computed from the
// parameters alone and it updates nothing (never the first).
std::vector<bool> parameter_launches(const sg::Graph& graph, const Schedule& schedule);

// Keeps every arena buffer a side launch reads or writes live from its fork
// to its join (see above); call between arena_request and plan_memory.
void keep_live_until_joined(ArenaRequest& request, const Schedule& schedule, const StreamPlan& plan);

}  // namespace sg::cuda
