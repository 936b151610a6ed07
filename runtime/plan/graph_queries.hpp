#pragma once
// Structural lookups the step matchers (mlp_step_pattern, cnn_step_pattern)
// walk a graph with: the one node of an op, the one reader of a value.
#include <cstddef>

#include "graph/graph.hpp"

namespace sg {

// The only node of kind `op` in the graph; null when there is none or several.
inline const Node* sole_node(const Graph& g, OpKind op) {
  const Node* found = nullptr;
  for (const Node& n : g.nodes())
    if (n.op == op) {
      if (found) return nullptr;
      found = &n;
    }
  return found;
}

// The only node of kind `op` reading `v` in input `slot` and passing
// `extra`; null when there is none or several.
template <typename Extra>
const Node* sole_reader(const Graph& g, ValueId v, OpKind op, std::size_t slot, Extra extra) {
  const Node* found = nullptr;
  for (NodeId id : g.consumers(v)) {
    const Node& n = g.node(id);
    if (n.op != op || n.inputs.size() <= slot || n.inputs[slot] != v || !extra(n)) continue;
    if (found) return nullptr;
    found = &n;
  }
  return found;
}
inline const Node* sole_reader(const Graph& g, ValueId v, OpKind op, std::size_t slot) {
  return sole_reader(g, v, op, slot, [](const Node&) { return true; });
}

}  // namespace sg
