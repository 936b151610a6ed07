#pragma once
// Structural lookups the step matchers (mlp_step_pattern, cnn_step_pattern)
// and the update lowerings walk a graph with: the one node of an op, the one
// reader of a value, the all-reduce bucket a gradient comes from, the
// activations' backward ops.
#include <cstddef>
#include <optional>

#include "graph/graph.hpp"

namespace sg {

// The element-wise activations the fused step kernels compute, and the
// backward op autodiff emits for each (graph/ops/<activation>.cpp), which
// reads the forward's output (relu, tanh, sigmoid) or its input (gelu,
// gelu_tanh, silu) beside the incoming gradient.
struct ActivationOps {
  OpKind forward, backward;
  bool backward_reads_input;
};
inline constexpr ActivationOps kActivationOps[] = {
    {OpKind::relu, OpKind::relu_backward, false},          {OpKind::gelu, OpKind::gelu_backward, true},
    {OpKind::gelu_tanh, OpKind::gelu_tanh_backward, true}, {OpKind::silu, OpKind::silu_backward, true},
    {OpKind::tanh, OpKind::tanh_backward, false},          {OpKind::sigmoid, OpKind::sigmoid_backward, false}};
// `forward`'s entry, or none when it is no such activation.
inline std::optional<ActivationOps> activation_ops(OpKind forward) {
  for (const ActivationOps& a : kActivationOps)
    if (a.forward == forward) return a;
  return std::nullopt;
}

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

// The all_reduce_mean node (a data-parallel bucket) that `grad`, as an update
// reads it, comes from, looking through the casts in between; -1 when there
// is none (a single process) or the gradient is clipped (scale_grad: it then
// waits for the clip scale, which reads every bucket).
inline NodeId reducing_bucket(const Graph& g, ValueId grad) {
  for (ValueId v = grad;;) {
    const NodeId producer = g.value(v).producer;
    if (producer < 0) return -1;
    const Node& n = g.node(producer);
    if (n.op == OpKind::all_reduce_mean) return producer;
    if (n.op != OpKind::cast) return -1;
    v = n.inputs[0];
  }
}

// The ranks `grad` (as an update reads it) is sharded over: its bucket's
// AllReduceAttrs::shards (ZeRO-1), 0 when it comes from no bucket or an
// unsharded one.
inline std::int64_t gradient_shards(const Graph& g, ValueId grad) {
  const NodeId bucket = reducing_bucket(g, grad);
  return bucket < 0 ? 0 : g.node(bucket).attr<AllReduceAttrs>().shards;
}

}  // namespace sg
