#pragma once
// A convolution's bias gradient taken with its weight gradient in one pass
// (conv_wgrad_bias of fast path our_conv, few_channel_wgrad of fast path
// few_channel_conv): which nodes such a launch takes. On one dY:
//   - the bias gradient: channel_sum(dY) (NCHW) or reduce_rows of dY seen as
//     [N*H*W, C] (channels-last: graph/channels_last_pass.hpp);
//   - the conv2d_backward_filter of dY;
//   - the cast of the f16/bf16 bias gradient to an fp32 master's, unless an
//     SGD update alone reads it (sgd_multi_tensor takes that cast with the
//     weights' casts, in one launch for all).
#include "runtime/cuda/lowerings/conv_nodes.hpp"
#include "runtime/cuda/lowerings/update_rule_table.hpp"

namespace sg::cuda {

struct WgradBiasNodes {
  NodeId wgrad = -1, sum = -1, cast = -1;
};

// The dY whose bias gradient node `sum` is, or -1: channel_sum(dY), or
// reduce_rows(reshape(dY)) with dY 4-D (channels-last).
inline ValueId bias_gradient_input(const sg::Graph& g, const Node& sum) {
  if (sum.op == OpKind::channel_sum) return sum.inputs[0];
  if (sum.op != OpKind::reduce_rows) return -1;
  const NodeId view = g.value(sum.inputs[0]).producer;
  if (view < 0 || g.node(view).op != OpKind::reshape) return -1;
  const ValueId dy = g.node(view).inputs[0];
  return g.value(dy).shape.size() == 4 ? dy : -1;
}

// The conv2d_backward_filter reading dY as its gradient, or -1.
inline NodeId filter_gradient_of(const sg::Graph& g, ValueId dy) {
  for (NodeId r : g.consumers(dy))
    if (g.node(r).op == OpKind::conv2d_backward_filter && g.node(r).inputs[0] == dy) return r;
  return -1;
}

// The match of a bias-gradient unit with the free weight gradient of the
// same dY in one floating dtype (and the cast after the sum, where it is
// free and no SGD update alone reads it), where `fits` takes the weight
// gradient's sizes; the detail is WgradBiasNodes.
template <typename Fits>
std::optional<Match> match_wgrad_bias(const Cover& cover, const CoverUnit& unit, Fits&& fits) {
  if (unit.fusion_group >= 0) return std::nullopt;
  const sg::Graph& g = cover.graph();
  const Node& sum = g.node(unit.nodes.front());
  const ValueId dy = bias_gradient_input(g, sum);
  if (dy < 0) return std::nullopt;
  const NodeId wgrad = filter_gradient_of(g, dy);
  const CoverUnit* wgrad_unit = free_lone_unit(cover, wgrad);
  if (!wgrad_unit) return std::nullopt;
  const Node& w = g.node(wgrad);
  const DType t = g.value(dy).dtype;
  if (!is_floating(t) || g.value(w.inputs[1]).dtype != t || g.value(w.outputs[0]).dtype != t ||
      g.value(sum.outputs[0]).dtype != t)
    return std::nullopt;
  const ConvSizes z = conv_sizes(g, w);
  // The sum reads the convolution's layout.
  if (z.channels_last != (sum.op == OpKind::reduce_rows) || !fits(z, t)) return std::nullopt;
  Match m = single_unit(unit);
  m.units.push_back(wgrad_unit->id);
  // The kernel reads dY itself, not the [N*H*W, C] view of it (made after
  // the weight gradient, where this launch runs).
  if (sum.inputs[0] != dy) m.unread.push_back(sum.inputs[0]);
  WgradBiasNodes nodes{wgrad, sum.id, -1};
  if (const CoverUnit* cast = free_widening_cast(cover, sum.outputs[0])) {
    const auto& readers = g.consumers(g.node(cast->nodes.front()).outputs[0]);
    const bool sgd_alone = readers.size() == 1 && g.node(readers[0]).op == OpKind::sgd_update;
    if (!sgd_alone) {
      nodes.cast = cast->nodes.front();
      m.units.push_back(cast->id);
    }
  }
  m.detail = nodes;
  return m;
}

// "wgrad+bias[+cast],stride=1,padding=2[,channels_last]".
inline std::string describe_wgrad_bias(const sg::Graph& g, const Launch& l) {
  const auto& nodes = detail_of<WgradBiasNodes>(l);
  const auto& a = g.node(nodes.wgrad).attr<Conv2dAttrs>();
  return fmt::format("wgrad+bias{},stride={},padding={}{}", nodes.cast >= 0 ? "+cast" : "", a.stride, a.padding,
                     a.channels_last ? ",channels_last" : "");
}

}  // namespace sg::cuda
