#pragma once
// Which graph nodes our fused kernels run as their activation (issue 21):
// the op <-> ops/cuda/activation.hpp tag, and the units a fused launch takes
// for a forward's activation or a dgrad's activation backward. ReLU and
// gelu_tanh arrive inside fusion groups (linear_forward ending in relu or
// gelu_tanh; dgrad_drelu, dgrad_dgelu); the other activations (gelu, silu,
// tanh, sigmoid), for which cuBLASLt has no epilogue, stay lone nodes in the
// fused graph, and our lowerings take those lone units beside the matmul's.
#include <optional>
#include <vector>

#include "ops/cuda/activation.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"
#include "runtime/plan/graph_queries.hpp"

namespace sg::cuda {

inline std::optional<Activation> forward_activation(OpKind op) {
  switch (op) {
    case OpKind::relu: return Activation::relu;
    case OpKind::gelu: return Activation::gelu;
    case OpKind::gelu_tanh: return Activation::gelu_tanh;
    case OpKind::silu: return Activation::silu;
    case OpKind::tanh: return Activation::tanh;
    case OpKind::sigmoid: return Activation::sigmoid;
    default: return std::nullopt;
  }
}

// The activation whose backward `op` is: the plan layer's table of forward
// and backward ops (graph_queries.hpp: kActivationOps) names the pairs.
inline std::optional<Activation> backward_activation(OpKind op) {
  for (const ActivationOps& a : kActivationOps)
    if (a.backward == op) return forward_activation(a.forward);
  return std::nullopt;
}

// A dgrad dX = act'(dY W) as one launch: the matmul and the activation's
// backward (dY, v), v being the forward input or output (activation.hpp).
struct ActivationDgrad {
  NodeId matmul = -1, backward = -1;
  Activation activation = Activation::relu;
  std::vector<int> units;  // the offered unit first
};

// The dgrad an offered unit starts: a dgrad_drelu or dgrad_dgelu group, or a
// lone activation-backward node whose gradient input is the only output of a
// lone free matmul read by nothing else. The caller checks shapes and dtypes.
inline std::optional<ActivationDgrad> activation_dgrad_of(const Cover& cover, const CoverUnit& unit) {
  const sg::Graph& g = cover.graph();
  ActivationDgrad d;
  if (cover.is_group(unit, FusionKind::dgrad_drelu) || cover.is_group(unit, FusionKind::dgrad_dgelu)) {
    d.matmul = node_of(g, unit, OpKind::matmul);
    d.backward = unit.nodes.back() == d.matmul ? unit.nodes.front() : unit.nodes.back();
    d.activation = *backward_activation(g.node(d.backward).op);
    d.units = {unit.id};
    return d;
  }
  if (unit.fusion_group >= 0 || unit.nodes.size() != 1) return std::nullopt;
  const Node& bw = g.node(unit.nodes[0]);
  const auto act = backward_activation(bw.op);
  if (!act || *act == Activation::relu) return std::nullopt;  // (a lone relu_backward has no fused forward: cuBLASLt's)
  const Value& dy = g.value(bw.inputs[0]);
  if (dy.producer < 0 || g.consumers(dy.id).size() != 1) return std::nullopt;
  const CoverUnit& mm_unit = cover.unit_of(dy.producer);
  const Node& mm = g.node(dy.producer);
  if (mm_unit.fusion_group >= 0 || cover.taken(mm_unit.id) || mm.op != OpKind::matmul || mm.outputs.size() != 1)
    return std::nullopt;
  d.matmul = mm.id;
  d.backward = bw.id;
  d.activation = *act;
  d.units = {unit.id, mm_unit.id};
  return d;
}

// The dgrad whose matmul is `matmul`, if its unit is free (activation_dgrad_of
// offered the unit holding the activation backward).
inline std::optional<ActivationDgrad> activation_dgrad_from_matmul(const Cover& cover, NodeId matmul) {
  const sg::Graph& g = cover.graph();
  const CoverUnit& u = cover.unit_of(matmul);
  if (cover.taken(u.id)) return std::nullopt;
  if (u.fusion_group >= 0) return activation_dgrad_of(cover, u);
  const auto readers = g.consumers(g.node(matmul).outputs[0]);
  if (readers.size() != 1) return std::nullopt;
  const CoverUnit& bw = cover.unit_of(readers[0]);
  if (cover.taken(bw.id)) return std::nullopt;
  auto d = activation_dgrad_of(cover, bw);
  if (!d || d->matmul != matmul) return std::nullopt;
  return d;
}

// The value a layer's weight update reads as its input when the activation
// backward `backward` sits before it: the activation's output. For ReLU,
// tanh and sigmoid that is what the backward reads; for gelu, gelu_tanh and
// silu the backward reads the pre-activation z, and the output is the one
// forward activation node's reading z (-1 when there is not exactly one).
inline ValueId activation_output_of(const sg::Graph& g, const Node& backward, Activation a) {
  const ValueId saved = backward.inputs[1];
  if (!backward_reads_input(a)) return saved;
  ValueId out = -1;
  for (NodeId r : g.consumers(saved)) {
    const Node& n = g.node(r);
    if (forward_activation(n.op) != a || n.inputs[0] != saved) continue;
    if (out >= 0) return -1;
    out = n.outputs[0];
  }
  return out;
}

// The free lone activation node reading a linear_forward group's output `z`
// (gelu, silu, tanh, sigmoid after a bias-only group), if there is exactly one.
inline const CoverUnit* free_lone_activation_of(const Cover& cover, ValueId z) {
  const sg::Graph& g = cover.graph();
  const CoverUnit* found = nullptr;
  for (NodeId reader : g.consumers(z)) {
    const CoverUnit& u = cover.unit_of(reader);
    const auto act = forward_activation(g.node(reader).op);
    if (!act || *act == Activation::relu || u.fusion_group >= 0 || cover.taken(u.id)) continue;
    if (found) return nullptr;
    found = &u;
  }
  return found;
}

}  // namespace sg::cuda
