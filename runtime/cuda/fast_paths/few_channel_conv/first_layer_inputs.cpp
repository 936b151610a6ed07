#include "runtime/cuda/fast_paths/few_channel_conv/first_layer_inputs.hpp"

#include <algorithm>

#include "graph/channels_last_pass.hpp"
#include "runtime/cuda/lowerings/lone_units.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"

namespace sg::cuda {
namespace {

// A free lone reshape, or a to_channels_last that keeps the element order
// (view.cpp's rule), reading `in` alone.
bool free_view(const Cover& cover, const Node& n) {
  const sg::Graph& g = cover.graph();
  if (!free_lone_unit(cover, n.id) || n.inputs.size() != 1) return false;
  const Value& in = g.value(n.inputs[0]);
  if (is_graph_owned(in.role) || is_graph_owned(g.value(n.outputs[0]).role)) return false;
  if (n.op == OpKind::reshape) return true;
  if (n.op != OpKind::to_channels_last) return false;
  const Shape& s = in.shape;  // [N,C,H,W]
  return layout_conversion_is_view(s[1], s[2] * s[3]);
}

// The batch fetch whose images reach `input` through free views; its nodes
// and those views, or nothing.
std::optional<FirstLayerInputs> fetch_behind(const Cover& cover, ValueId input) {
  const sg::Graph& g = cover.graph();
  FirstLayerInputs in;
  ValueId v = input;
  for (NodeId p = g.value(v).producer; p >= 0 && g.node(p).op != OpKind::gather_rows; p = g.value(v).producer) {
    if (!free_view(cover, g.node(p))) return std::nullopt;
    in.views.insert(in.views.begin(), p);
    v = g.node(p).inputs[0];
  }
  const NodeId gather = g.value(v).producer;
  const CoverUnit* group = gather >= 0 ? cover.free_group_with(gather, FusionKind::batch_fetch) : nullptr;
  const auto fetch = group ? u8_fetch_nodes(g, *group) : std::nullopt;
  if (!fetch || fetch->images != gather) return std::nullopt;
  // The kernel takes a table row as one image of the batch.
  const Shape& x = g.value(input).shape;
  if (g.node(fetch->indices).attr<BatchIndicesAttrs>().batch != x[0] ||
      g.value(g.node(gather).inputs[0]).shape[1] != x[1] * x[2] * x[3])
    return std::nullopt;
  in.fetch = *fetch;
  return in;
}

// The lone cast of an fp32 parameter (param_cast_to) whose only reader is `reader`, or -1.
NodeId master_cast(const Cover& cover, ValueId v, NodeId reader) {
  const sg::Graph& g = cover.graph();
  const NodeId p = g.value(v).producer;
  if (p < 0 || !param_cast_to(g, g.node(p)) || !free_lone_unit(cover, p) || sole_reader(g, v) != reader) return -1;
  return p;
}

}  // namespace

FirstLayerInputs take_first_layer_inputs(const Cover& cover, const Node& conv, int conv_unit, Match& m) {
  const sg::Graph& g = cover.graph();
  FirstLayerInputs in = fetch_behind(cover, conv.inputs[0]).value_or(FirstLayerInputs{});
  if (in.fetches()) {
    m.units.push_back(cover.unit_of(in.fetch.images).id);
    for (NodeId view : in.views) {
      m.units.push_back(cover.unit_of(view).id);
      m.aliases.emplace_back(g.node(view).outputs[0], g.node(view).inputs[0]);
    }
  }
  // Both casts or neither: one flag says how the kernel reads the parameters.
  const NodeId w = master_cast(cover, conv.inputs[1], conv.id);
  const NodeId b = conv.inputs.size() == 3 ? master_cast(cover, conv.inputs[2], conv.id) : -1;
  if (w >= 0 && (conv.inputs.size() == 2 || b >= 0)) {
    in.weight_cast = w;
    in.bias_cast = b;
    m.units.push_back(cover.unit_of(w).id);
    if (b >= 0) m.units.push_back(cover.unit_of(b).id);
  }
  m.runs_at_unit = conv_unit;  // not at the fetch's place: the casts it leaves come after it
  return in;
}

FewChannelForwardArgs bind_first_layer_inputs(const FirstLayerInputs& in, const Node& conv, const Launch& l,
                                              const BindContext& c) {
  const sg::Graph& g = c.graph();
  FewChannelForwardArgs a;
  const bool f32 = in.weight_cast >= 0;
  a.params_f32 = f32;
  a.w = c.ptr(f32 ? g.node(in.weight_cast).inputs[0] : conv.inputs[1]);
  if (conv.inputs.size() == 3) a.bias = c.ptr(f32 ? g.node(in.bias_cast).inputs[0] : conv.inputs[2]);
  if (!in.fetches()) {
    a.x = c.ptr(conv.inputs[0]);
    return a;
  }
  const BoundFetch b = bind_fetch(in.fetch, c);
  a.fetch = {b.perm, b.rows, b.step, b.rank, b.ranks, b.images, b.scale, b.shift, b.labels, nullptr, b.labels_out};
  // X (the gathered images and their views: one buffer) where a later launch reads it (the weight gradient).
  std::vector<ValueId> chain{g.node(in.fetch.images).outputs[0]};
  for (NodeId view : in.views) chain.push_back(g.node(view).outputs[0]);
  if (std::any_of(chain.begin(), chain.end(), [&](ValueId v) { return launch_writes(l, v); }))
    a.fetch.x_out = c.ptr(conv.inputs[0]);
  return a;
}

}  // namespace sg::cuda
