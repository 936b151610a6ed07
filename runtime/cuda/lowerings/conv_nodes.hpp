#pragma once
// What the convolution lowerings (conv_cudnn, conv_implicit_gemm) share:
// which nodes a convolution launch takes (a conv2d with the relu right after
// it, or a lone conv2d_backward_data / conv2d_backward_filter), its sizes
// from the node's operands, and its line in the schedule dump.
#include <cstdint>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "runtime/cuda/lowerings/lone_units.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"

namespace sg::cuda {

struct ConvNodes {
  NodeId conv = -1;
  NodeId relu = -1;  // forward only: the relu taken with it
};

// A convolution's sizes in the forward's terms: input n x c x h x w, k
// filters of c x r x s.
struct ConvSizes {
  std::int64_t n = 0, c = 0, h = 0, w = 0, k = 0, r = 0, s = 0, stride = 1, padding = 0;
};

inline bool is_conv(OpKind op) {
  return op == OpKind::conv2d || op == OpKind::conv2d_backward_data || op == OpKind::conv2d_backward_filter;
}

// The sizes from the node's operands (the backward ops name the spatial size
// of what they produce in grad_h x grad_w).
inline ConvSizes conv_sizes(const sg::Graph& g, const Node& n) {
  const auto& a = n.attr<Conv2dAttrs>();
  const Shape& in0 = g.value(n.inputs[0]).shape;
  const Shape& in1 = g.value(n.inputs[1]).shape;
  switch (n.op) {
    case OpKind::conv2d:  // (X, W[, bias])
      return {in0[0], in0[1], in0[2], in0[3], in1[0], in1[2], in1[3], a.stride, a.padding};
    case OpKind::conv2d_backward_data:  // (dY, W) -> dX
      return {in0[0], in1[1], a.grad_h, a.grad_w, in1[0], in1[2], in1[3], a.stride, a.padding};
    default:  // conv2d_backward_filter: (dY, X) -> dW
      return {in1[0], in1[1], in1[2], in1[3], in0[1], a.grad_h, a.grad_w, a.stride, a.padding};
  }
}

// The lone relu reading the forward's output, when it is that output's only
// reader and the output is not a graph output (then it is never written).
inline const CoverUnit* free_relu_after(const Cover& cover, const Node& conv) {
  return free_sole_reader(cover, conv.outputs[0], OpKind::relu);
}

// The match of a convolution unit whose operands all have one floating
// dtype `accepts` takes (and whose sizes `fits`): the conv [+ its relu].
template <typename Accepts, typename Fits>
std::optional<Match> match_conv(const Cover& cover, const CoverUnit& unit, Accepts&& accepts, Fits&& fits) {
  if (unit.fusion_group >= 0) return std::nullopt;
  const sg::Graph& g = cover.graph();
  const Node& n = g.node(unit.nodes.front());
  if (!is_conv(n.op)) return std::nullopt;
  const DType t = g.value(n.outputs[0]).dtype;
  if (!accepts(t)) return std::nullopt;
  for (ValueId in : n.inputs)
    if (g.value(in).dtype != t) return std::nullopt;
  if (!fits(conv_sizes(g, n))) return std::nullopt;
  ConvNodes nodes{n.id, -1};
  Match m = single_unit(unit);
  if (n.op == OpKind::conv2d)
    if (const CoverUnit* relu = free_relu_after(cover, n)) {
      nodes.relu = relu->nodes.front();
      m.units.push_back(relu->id);
    }
  m.detail = nodes;
  return m;
}

// "forward+bias+relu,stride=1,padding=0", "dgrad,...", "wgrad,...".
inline std::string describe_conv(const sg::Graph& g, const Launch& l) {
  const auto& nodes = detail_of<ConvNodes>(l);
  const Node& n = g.node(nodes.conv);
  const auto& a = n.attr<Conv2dAttrs>();
  std::string what = n.op == OpKind::conv2d                 ? (n.inputs.size() == 3 ? "forward+bias" : "forward")
                     : n.op == OpKind::conv2d_backward_data ? "dgrad"
                                                            : "wgrad";
  if (nodes.relu >= 0) what += "+relu";
  return fmt::format("{},stride={},padding={}", what, a.stride, a.padding);
}

}  // namespace sg::cuda
