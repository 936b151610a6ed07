#pragma once
// Reverse-mode autodiff over the op graph: appends, for every node on a path
// from a parameter to the loss, the nodes computing its input gradients
// (rules per op in autodiff.cpp). No model-specific backward code.
#include <map>

#include "graph/graph.hpp"

namespace sg {

struct GradientMap {
  std::map<ValueId, ValueId> of_param;  // param value -> its gradient value
};

// `loss` must be the f32 [1] output of softmax_xent (the seed dloss = 1).
// Throws GraphError when a needed op has no gradient rule.
GradientMap append_backward(Graph& graph, ValueId loss);

}  // namespace sg
