#pragma once
// Which launches of a training step only feed the parameter updates: the
// weight and bias gradients, their casts and sums, and the updates
// themselves. Nothing later in the step's backward pass reads what they
// write, so they may run beside the data-gradient chain (the launches that
// carry dL/dx from the loss down to the first layer) instead of between its
// launches (runtime/cuda/stream_plan.hpp puts them on a second stream).
//
// A value feeds only the updates when every node reading it is an update
// rule (sgd_update, adam_update, rmsprop_update), or a cheap step on the way
// to one (cast, reduce_rows, channel_sum, reshape, flatten, add, scale_grad,
// grad_clip_scale, all_reduce_mean) whose outputs all feed only the updates.
// A weight gradient's matmul or conv2d_backward_filter is not such a step,
// so the gradients they read (dY) and the activations (X) stay on the chain.
// A launch is on an update branch when all it writes feeds only the updates
// and it writes or updates something; launches that use a ReLU mask buffer
// (Schedule::aux) are left on the chain. Backend-neutral.
#include <vector>

#include "runtime/plan/schedule.hpp"

namespace sg {

// Per value id: whether it feeds only the parameter updates (see above).
std::vector<bool> feeds_only_updates(const Graph& graph);

// Per launch of `schedule`: whether it is on an update branch.
std::vector<bool> update_branch_launches(const Graph& graph, const Schedule& schedule);

}  // namespace sg
