#pragma once
// Recognises a fused graph that is exactly the training step of an MLP
// (batch fetch, Linear+ReLU layers, softmax cross-entropy, its autodiff
// backward, plain SGD, step advance), so a backend may run it as one
// whole-step kernel. Recognition is by reconstruction: the spec is read off
// the graph, the step is rebuilt from it with the standard passes, and only
// an identical graph matches; anything else keeps the per-group schedule.
#include <optional>

#include "runtime/plan/schedule.hpp"

namespace sg {

std::optional<WholeStepPlan> match_whole_step(const Graph& graph);

}  // namespace sg
