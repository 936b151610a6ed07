#pragma once
// What the convolution lowerings (conv_cudnn, conv_implicit_gemm) share:
// which nodes a convolution launch takes (a conv2d with the relu right after
// it, or a lone conv2d_backward_data / conv2d_backward_filter), its sizes
// from the node's operands, and its line in the schedule dump.
#include <cstdint>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "ops/cuda/conv_implicit_gemm.hpp"
#include "runtime/cuda/lowerings/lone_units.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"

namespace sg::cuda {

struct ConvNodes {
  NodeId conv = -1;
  NodeId relu = -1;  // forward only: the relu taken with it
};

// A convolution's sizes in the forward's terms: input n x c x h x w, k
// filters of c x r x s; channels_last: the activations are [N,H,W,C];
// filter_channels_last: the filter (or dW) is [K,R,S,C].
struct ConvSizes {
  std::int64_t n = 0, c = 0, h = 0, w = 0, k = 0, r = 0, s = 0, stride = 1, padding = 0;
  bool channels_last = false;
  bool filter_channels_last = false;
};

// Whether the filter's bytes are in [K,C,R,S] order, what our non-tensor-core
// convolution kernels read or write: it is so laid out, or [K,R,S,C] with one
// input channel (the same bytes).
inline bool filter_bytes_kcrs(const ConvSizes& z) { return !z.filter_channels_last || z.c == 1; }

inline bool is_conv(OpKind op) {
  return op == OpKind::conv2d || op == OpKind::conv2d_backward_data || op == OpKind::conv2d_backward_filter;
}

// The sizes from the node's operands (the backward ops name the spatial size
// of what they produce in grad_h x grad_w).
inline ConvSizes conv_sizes(const sg::Graph& g, const Node& n) {
  const auto& a = n.attr<Conv2dAttrs>();
  // A value's sizes channels-first (an activation's N, C, H, W; a filter's
  // K, C, R, S) whether its layout is `last` or not.
  const auto first = [&](ValueId v, bool last) {
    const Shape& s = g.value(v).shape;
    return last ? Shape{s[0], s[3], s[1], s[2]} : s;
  };
  const bool cl = a.channels_last, fl = a.filter_channels_last;
  const auto nchw = [&](ValueId v) { return first(v, cl); };
  const auto kcrs = [&](ValueId v) { return first(v, fl); };
  switch (n.op) {
    case OpKind::conv2d: {  // (X, W[, bias])
      const Shape x = nchw(n.inputs[0]), w = kcrs(n.inputs[1]);
      return {x[0], x[1], x[2], x[3], w[0], w[2], w[3], a.stride, a.padding, cl, fl};
    }
    case OpKind::conv2d_backward_data: {  // (dY, W) -> dX
      const Shape dy = nchw(n.inputs[0]), w = kcrs(n.inputs[1]);
      return {dy[0], w[1], a.grad_h, a.grad_w, w[0], w[2], w[3], a.stride, a.padding, cl, fl};
    }
    default: {  // conv2d_backward_filter: (dY, X) -> dW
      const Shape dy = nchw(n.inputs[0]), x = nchw(n.inputs[1]);
      return {x[0], x[1], x[2], x[3], dy[1], a.grad_h, a.grad_w, a.stride, a.padding, cl, fl};
    }
  }
}

// Our kernels' shape (ops/cuda/conv_implicit_gemm.hpp) of those sizes.
inline ConvShape implicit_gemm_shape(const ConvSizes& z) {
  return {z.n, z.c, z.h, z.w, z.k, z.r, z.s, z.stride, z.padding, z.channels_last};
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
inline std::string describe_conv(const sg::Graph& g, const ConvNodes& nodes) {
  const Node& n = g.node(nodes.conv);
  const auto& a = n.attr<Conv2dAttrs>();
  std::string what = n.op == OpKind::conv2d                 ? (n.inputs.size() == 3 ? "forward+bias" : "forward")
                     : n.op == OpKind::conv2d_backward_data ? "dgrad"
                                                            : "wgrad";
  if (nodes.relu >= 0) what += "+relu";
  return fmt::format("{},stride={},padding={}{}", what, a.stride, a.padding, a.channels_last ? ",channels_last" : "");
}
inline std::string describe_conv(const sg::Graph& g, const Launch& l) {
  return describe_conv(g, detail_of<ConvNodes>(l));
}

}  // namespace sg::cuda
