// Finding a classifier head in the cover (classifier_head_pattern.hpp).
#include "runtime/cuda/fast_paths/classifier_head/classifier_head_pattern.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "runtime/cuda/lowerings/lone_units.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"

namespace sg::cuda {
namespace {

const CoverUnit* free_unit(const Cover& cover, NodeId n) {
  if (n < 0) return nullptr;
  const CoverUnit& u = cover.unit_of(n);
  return cover.taken(u.id) ? nullptr : &u;
}

// v's sole reader when it is a free lone node of `op` (free_sole_reader's node), else -1.
NodeId lone_reader(const Cover& cover, ValueId v, OpKind op) {
  const CoverUnit* u = free_sole_reader(cover, v, op);
  return u ? u->nodes.front() : -1;
}

// v's producer when it is a free lone node of `op` and v is read only by `reader`.
NodeId lone_producer(const Cover& cover, ValueId v, OpKind op, NodeId reader) {
  const sg::Graph& g = cover.graph();
  const NodeId p = g.value(v).producer;
  if (p < 0 || g.node(p).op != op || sole_reader(g, v) != reader) return -1;
  return free_lone_unit(cover, p) ? p : -1;
}

std::vector<NodeId> head_node_list(const HeadNodes& h) {
  std::vector<NodeId> all;
  for (NodeId n : {h.xent, h.xent_backward, h.matmul, h.bias_add, h.dgrad, h.to_first, h.pool, h.flatten,
                   h.grad_reshape, h.pool_backward, h.to_last})
    if (n >= 0) all.push_back(n);
  return all;
}

// The pooling before the features X (flatten of a global pool, channels-last through to_channels_first).
void find_pooling(const Cover& cover, ValueId x, HeadNodes& h) {
  const sg::Graph& g = cover.graph();
  const NodeId flatten = g.value(x).producer;
  if (flatten < 0 || g.node(flatten).op != OpKind::flatten || !free_lone_unit(cover, flatten)) return;
  h.flatten = flatten;
  const ValueId pooled = g.node(h.flatten).inputs[0];
  h.pool = lone_producer(cover, pooled, OpKind::global_avg_pool2d, h.flatten);
  if (h.pool < 0) {
    h.flatten = -1;
    return;
  }
  const ValueId a = g.node(h.pool).inputs[0];
  const Shape& s = g.value(a).shape;  // [N,C,H,W]
  h.shape.plane = s[2] * s[3];
  h.to_first = lone_producer(cover, a, OpKind::to_channels_first, h.pool);
  h.shape.source = h.to_first >= 0 ? HeadFeatures::pool_channels_last : HeadFeatures::pool_nchw;
}

// dX's consumers folded into the launch: the pool's backward chain back to the activation's layout.
void find_pool_backward(const Cover& cover, HeadNodes& h) {
  const sg::Graph& g = cover.graph();
  const NodeId reshape = lone_reader(cover, g.node(h.dgrad).outputs[0], OpKind::reshape);
  if (reshape < 0) return;
  const NodeId back = lone_reader(cover, g.node(reshape).outputs[0], OpKind::global_avg_pool2d_backward);
  if (back < 0) return;
  const NodeId to_last = lone_reader(cover, g.node(back).outputs[0], OpKind::to_channels_last);
  // The gradient goes out in the features' layout: channels-last needs the conversion back.
  if (h.shape.source == HeadFeatures::pool_channels_last && to_last < 0) return;
  h.grad_reshape = reshape;
  h.pool_backward = back;
  if (h.shape.source == HeadFeatures::pool_channels_last) h.to_last = to_last;
}

}  // namespace

std::optional<HeadNodes> find_classifier_head(const Cover& cover, const CoverUnit& unit, std::string* why_not) {
  const auto fail = [&](std::string why) -> std::optional<HeadNodes> {
    if (why_not) *why_not = std::move(why);
    return std::nullopt;
  };
  const sg::Graph& g = cover.graph();
  HeadNodes h;
  h.xent = node_of(g, unit, OpKind::softmax_xent);
  if (h.xent < 0) return fail("no softmax_xent loss");
  const Node& xent = g.node(h.xent);
  const ValueId logits = xent.inputs[0], labels = xent.inputs[1];
  for (NodeId r : g.consumers(logits))
    if (g.node(r).op == OpKind::softmax_xent_backward && g.node(r).inputs[1] == labels) h.xent_backward = r;
  if (h.xent_backward < 0) return fail("the loss has no backward here (an evaluation graph)");
  if (g.consumers(logits).size() != 2 || is_graph_output(g, logits)) return fail("the logits have other readers");
  // The linear layer.
  NodeId producer = g.value(logits).producer;
  if (producer >= 0 && g.node(producer).op == OpKind::bias_add) {
    h.bias_add = producer;
    producer = g.value(g.node(producer).inputs[0]).producer;
  }
  if (producer < 0 || g.node(producer).op != OpKind::matmul)
    return fail("the logits do not come from a linear layer (matmul [+ bias_add])");
  h.matmul = producer;
  if (h.bias_add >= 0 && sole_reader(g, g.node(h.matmul).outputs[0]) != h.bias_add)
    return fail("the linear layer's product has other readers");
  const Node& mm = g.node(h.matmul);
  const MatmulShape s = operand_shape(g, mm);
  if (s.trans_a || !s.trans_b) return fail("the linear layer is not X W^T");
  h.shape.rows = s.m, h.shape.features = s.k, h.shape.classes = s.n;
  h.shape.gradient_scale = static_cast<float>(g.node(h.xent_backward).attr<LossGradientAttrs>().scale);
  const ValueId w = mm.inputs[1], dlogits = g.node(h.xent_backward).outputs[0];
  const DType t = g.value(logits).dtype;
  std::vector<ValueId> same_type = {mm.inputs[0], w, dlogits};
  if (h.bias_add >= 0) same_type.push_back(g.node(h.bias_add).inputs[1]);
  const bool one_type =
      std::all_of(same_type.begin(), same_type.end(), [&](ValueId v) { return g.value(v).dtype == t; });
  if ((t != DType::f16 && t != DType::bf16 && t != DType::f32) || !one_type)
    return fail(fmt::format("the layer's tensors are not all f16, bf16 or f32 ({} logits)", dtype_name(t)));
  find_pooling(cover, mm.inputs[0], h);
  if (h.pool < 0)
    return fail("the classifier's features are not a global average pool (a flatten or a hidden layer: the per-op "
                "kernels were measured faster there)");
  // The data gradient: a lone matmul dlogits W (no transposes).
  for (NodeId r : g.consumers(dlogits)) {
    const Node& n = g.node(r);
    if (n.op != OpKind::matmul || n.inputs[0] != dlogits || n.inputs[1] != w || !free_lone_unit(cover, r)) continue;
    const MatmulShape d = operand_shape(g, n);
    if (!d.trans_a && !d.trans_b && g.value(n.outputs[0]).dtype == t) h.dgrad = r;
  }
  if (h.dgrad >= 0) find_pool_backward(cover, h);
  // Every unit of these nodes, whole.
  const std::vector<NodeId> nodes = head_node_list(h);
  h.units = {unit.id};
  for (NodeId n : nodes) {
    const CoverUnit* u = free_unit(cover, n);
    if (!u) return fail(fmt::format("{} node {} is taken by another launch", op_name(g.node(n).op), n));
    for (NodeId member : u->nodes)
      if (std::find(nodes.begin(), nodes.end(), member) == nodes.end())
        return fail(fmt::format("{} node {} is fused with {} node {}", op_name(g.node(n).op), n,
                                op_name(g.node(member).op), member));
    if (std::find(h.units.begin(), h.units.end(), u->id) == h.units.end()) h.units.push_back(u->id);
  }
  return h;
}

}  // namespace sg::cuda
