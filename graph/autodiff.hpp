#pragma once
// Reverse-mode autodiff over the op graph: appends, for every node on a path
// from a parameter to the loss, the nodes computing its input gradients. The
// rules live with the ops (OpDef::gradient in graph/ops/); a rule sees the
// gradients of all of a node's outputs, so multi-output nodes work. No
// model-specific backward code.
#include <map>

#include "graph/graph.hpp"

namespace sg {

struct GradientMap {
  std::map<ValueId, ValueId> of_param;  // param value -> its gradient value
};

// `loss` must be the scalar output of an op whose registry entry declares it
// a loss (OpDef::loss_gradient, e.g. softmax_xent): the seed is dLoss = 1.
// Throws GraphError naming the value otherwise, and when a needed op has no
// gradient rule or a parameter does not reach the loss.
GradientMap append_backward(Graph& graph, ValueId loss);

}  // namespace sg
