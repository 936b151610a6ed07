#include "graph/fusion_pass.hpp"

#include <algorithm>
#include <optional>

namespace sg {
namespace {

class GroupCollector {
 public:
  explicit GroupCollector(const Graph& g) : g_(g), taken_(g.nodes().size(), false) {}

  bool free(NodeId n) const { return n >= 0 && !taken_[static_cast<std::size_t>(n)]; }
  void add(FusionKind kind, std::vector<NodeId> nodes) {
    std::sort(nodes.begin(), nodes.end());
    for (NodeId n : nodes) taken_[static_cast<std::size_t>(n)] = true;
    groups_.push_back({-1, kind, std::move(nodes)});
  }
  std::vector<FusionGroup> take() { return std::move(groups_); }
  // The node whose only output `v` is read by exactly one node, which is `reader`.
  std::optional<NodeId> sole_feeder(ValueId v, NodeId reader) const {
    const Value& value = g_.value(v);
    if (value.producer < 0 || !free(value.producer)) return std::nullopt;
    const auto readers = g_.consumers(v);
    if (readers.size() != 1 || readers[0] != reader || g_.node(value.producer).outputs.size() != 1) return std::nullopt;
    return value.producer;
  }
  // The single consumer of `v`, if it is the only one.
  std::optional<NodeId> sole_reader(ValueId v) const {
    const auto readers = g_.consumers(v);
    if (readers.size() != 1 || !free(readers[0])) return std::nullopt;
    return readers[0];
  }

 private:
  const Graph& g_;
  std::vector<bool> taken_;
  std::vector<FusionGroup> groups_;
};

void fuse_batch_fetch(const Graph& g, GroupCollector& c) {
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::batch_indices || !c.free(n.id)) continue;
    std::vector<NodeId> members{n.id};
    bool only_gathers = true;
    for (NodeId r : g.consumers(n.outputs[0])) {
      only_gathers = only_gathers && g.node(r).op == OpKind::gather_rows && c.free(r);
      members.push_back(r);
    }
    if (only_gathers && members.size() > 1) c.add(FusionKind::batch_fetch, members);
  }
}

// The gelu_tanh node reading the pre-activation `z`, if every other reader of
// `z` is a gelu_tanh_backward taking it as the forward input (cuBLASLt's
// GELU_AUX epilogue writes z for them beside the activation).
std::optional<NodeId> fusable_gelu_tanh(const Graph& g, const GroupCollector& c, ValueId z) {
  std::optional<NodeId> gelu;
  for (NodeId r : g.consumers(z)) {
    const Node& reader = g.node(r);
    if (reader.op == OpKind::gelu_tanh && !gelu && c.free(r)) gelu = r;
    else if (reader.op != OpKind::gelu_tanh_backward || reader.inputs[1] != z || reader.inputs[0] == z) return std::nullopt;
  }
  return gelu;
}

// matmul -> bias_add [-> relu | gelu_tanh]
void fuse_linear_forward(const Graph& g, GroupCollector& c) {
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::bias_add || !c.free(n.id)) continue;
    const auto mm = c.sole_feeder(n.inputs[0], n.id);
    if (!mm || g.node(*mm).op != OpKind::matmul) continue;
    std::vector<NodeId> members{*mm, n.id};
    if (auto r = c.sole_reader(n.outputs[0]); r && g.node(*r).op == OpKind::relu) members.push_back(*r);
    else if (auto gelu = fusable_gelu_tanh(g, c, n.outputs[0])) members.push_back(*gelu);
    c.add(FusionKind::linear_forward, members);
  }
}

// matmul -> gelu_tanh_backward(dY, z), where z is the pre-activation of a
// linear_forward group ending in gelu_tanh (cuBLASLt's DGELU reads it as aux).
void fuse_dgrad_dgelu(const Graph& g, GroupCollector& c) {
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::gelu_tanh_backward || !c.free(n.id)) continue;
    const auto mm = c.sole_feeder(n.inputs[0], n.id);
    if (!mm || g.node(*mm).op != OpKind::matmul) continue;
    const NodeId z_producer = g.value(n.inputs[1]).producer;
    if (z_producer < 0 || g.node(z_producer).op != OpKind::bias_add || g.node(z_producer).fusion_group < 0) continue;
    const FusionGroup& forward = g.fusion_groups()[static_cast<std::size_t>(g.node(z_producer).fusion_group)];
    if (forward.kind == FusionKind::linear_forward && g.node(forward.nodes.back()).op == OpKind::gelu_tanh)
      c.add(FusionKind::dgrad_dgelu, {*mm, n.id});
  }
}

// matmul -> relu_backward, where the relu's mask comes from a fused forward.
void fuse_dgrad_drelu(const Graph& g, GroupCollector& c) {
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::relu_backward || !c.free(n.id)) continue;
    const auto mm = c.sole_feeder(n.inputs[0], n.id);
    if (!mm || g.node(*mm).op != OpKind::matmul) continue;
    const Value& relu_out = g.value(n.inputs[1]);
    if (relu_out.producer < 0) continue;
    const Node& relu = g.node(relu_out.producer);
    const bool mask_available = relu.op == OpKind::relu && relu.fusion_group >= 0 &&
                                g.fusion_groups()[static_cast<std::size_t>(relu.fusion_group)].kind ==
                                    FusionKind::linear_forward;
    if (mask_available) c.add(FusionKind::dgrad_drelu, {*mm, n.id});
  }
}

// A channels-last convolution's bias gradient: reduce_rows of its 4-D dY
// seen as [N*H*W, C], where dY also feeds the filter gradient. The
// convolution's weight-gradient launches sum it in their own pass over dY
// (few_channel_wgrad, conv_wgrad_bias), and the SGD update then joins the
// multi-tensor one; as a bgrad_sgd group it took a column sum of its own
// (LeNet-5's 6 channels x 200,704 rows: 23.5 us on an H200).
bool conv_bias_rows(const Graph& g, const Node& sum) {
  const NodeId view = g.value(sum.inputs[0]).producer;
  if (view < 0 || g.node(view).op != OpKind::reshape) return false;
  const ValueId dy = g.node(view).inputs[0];
  if (g.value(dy).shape.size() != 4) return false;
  for (NodeId r : g.consumers(dy))
    if (g.node(r).op == OpKind::conv2d_backward_filter) return true;
  return false;
}

// producer [-> cast] -> sgd_update(grad): the gradient never needs a buffer.
void fuse_sgd(const Graph& g, GroupCollector& c, OpKind producer_op, FusionKind kind) {
  for (const Node& n : g.nodes()) {
    // Nesterov needs the gradient after the velocity update: no fused matmul form.
    if (n.op != OpKind::sgd_update || !c.free(n.id) || n.attr<SgdUpdateAttrs>().nesterov) continue;
    std::vector<NodeId> members{n.id};
    auto feeder = c.sole_feeder(n.inputs[1], n.id);
    if (feeder && g.node(*feeder).op == OpKind::cast) {
      members.push_back(*feeder);
      feeder = c.sole_feeder(g.node(*feeder).inputs[0], *feeder);
    }
    if (!feeder || g.node(*feeder).op != producer_op) continue;
    if (producer_op == OpKind::reduce_rows && conv_bias_rows(g, g.node(*feeder))) continue;
    members.push_back(*feeder);
    c.add(kind, members);
  }
}

void fuse_loss(const Graph& g, GroupCollector& c) {
  for (const Node& fwd : g.nodes()) {
    if (fwd.op != OpKind::softmax_xent || !c.free(fwd.id)) continue;
    for (const Node& bwd : g.nodes())
      if (bwd.op == OpKind::softmax_xent_backward && c.free(bwd.id) && bwd.inputs == fwd.inputs) {
        c.add(FusionKind::xent_fused, {fwd.id, bwd.id});
        break;
      }
  }
}

}  // namespace

void fuse(Graph& g, const FusionOptions& options) {
  GroupCollector c(g);
  if (options.batch_fetch) fuse_batch_fetch(g, c);
  if (options.matmul_epilogues) fuse_linear_forward(g, c);
  if (options.fused_sgd) {
    fuse_sgd(g, c, OpKind::matmul, FusionKind::wgrad_sgd);
    fuse_sgd(g, c, OpKind::reduce_rows, FusionKind::bgrad_sgd);
  }
  if (options.fused_loss) fuse_loss(g, c);
  // dgrad_drelu / dgrad_dgelu need to know which activations were fused, so they run on the
  // groups collected so far.
  auto groups = c.take();
  g.set_fusion_groups(groups);
  if (options.matmul_epilogues) {
    GroupCollector more(g);
    for (const auto& group : groups) more.add(group.kind, group.nodes);
    fuse_dgrad_drelu(g, more);
    fuse_dgrad_dgelu(g, more);
    g.set_fusion_groups(more.take());
  }
}

}  // namespace sg
