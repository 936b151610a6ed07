#include "runtime/plan/mlp_step_pattern.hpp"

#include <algorithm>
#include <set>

#include "runtime/plan/graph_queries.hpp"

namespace sg {
namespace {

// Walks the graph from the batch fetch, collecting every node it expects;
// any surprise ends the match.
class StepWalker {
 public:
  explicit StepWalker(const Graph& g) : g_(g) {}

  std::optional<WholeStepPlan> run() {
    const Node* indices = only_node(OpKind::batch_indices);
    if (!indices || indices->attr<BatchIndicesAttrs>().ranks != 1) return std::nullopt;  // not a data-parallel shard
    WholeStepPlan plan;
    plan.perm = indices->inputs[0];
    plan.step = indices->inputs[1];
    plan.batch = indices->attr<BatchIndicesAttrs>().batch;
    const Node* images = nullptr;
    const Node* labels = nullptr;
    for (NodeId id : g_.consumers(indices->outputs[0])) {
      const Node& n = g_.node(id);
      if (n.op != OpKind::gather_rows) return std::nullopt;
      (g_.value(n.outputs[0]).dtype == DType::i32 ? labels : images) = &n;
    }
    if (!images || !labels || g_.consumers(indices->outputs[0]).size() != 2) return std::nullopt;
    if (!group({indices->id, images->id, labels->id}, FusionKind::batch_fetch)) return std::nullopt;
    plan.images = images->inputs[0];
    plan.labels = labels->inputs[0];
    // The whole-step kernels fetch u8 images and u8 labels; f16/f32 feature
    // tables (own data) take the generic lowerings.
    if (g_.value(plan.images).dtype != DType::u8 || g_.value(plan.labels).dtype != DType::u8) return std::nullopt;
    plan.input_scale = images->attr<GatherRowsAttrs>().scale;
    plan.input_shift = images->attr<GatherRowsAttrs>().shift;
    const ValueId y = labels->outputs[0];

    // Forward: h -> matmul(h, W^T) -> bias_add(b) [-> activation] until the loss reads it.
    std::vector<ValueId> inputs{images->outputs[0]};  // each layer's input
    ValueId h = images->outputs[0];
    plan.dims.push_back(g_.value(h).shape.at(1));
    const Node* xent = nullptr;
    std::optional<OpKind> activation;  // the first hidden layer's; every other must be the same
    while (!xent) {
      const Node* mm = reader(h, OpKind::matmul, 0, [](const Node& n) {
        return !n.attr<MatmulAttrs>().trans_a && n.attr<MatmulAttrs>().trans_b;
      });
      if (!mm || g_.value(mm->inputs[1]).role != Role::param) return std::nullopt;
      const Node* add = reader(mm->outputs[0], OpKind::bias_add, 0);
      if (!add || g_.value(add->inputs[1]).role != Role::param) return std::nullopt;
      WholeStepLayer layer;
      layer.weight = mm->inputs[1];
      layer.bias = add->inputs[1];
      layer.output = add->outputs[0];
      plan.dims.push_back(g_.value(layer.weight).shape.at(0));
      xent = reader(add->outputs[0], OpKind::softmax_xent, 0);
      std::vector<NodeId> forward{mm->id, add->id};
      if (!xent) {
        const Node* act = activation_reader(add->outputs[0]);
        if (!act || (activation && act->op != *activation)) return std::nullopt;
        activation = act->op;
        // relu and gelu_tanh end the linear_forward group; the others follow it as lone nodes.
        if (act->fusion_group >= 0) forward.push_back(act->id);
        else seen_.insert(act->id);
        layer.pre_activation = add->outputs[0];
        layer.output = act->outputs[0];
      }
      if (!group(forward, FusionKind::linear_forward)) return std::nullopt;
      plan.layers.push_back(layer);
      h = layer.output;
      inputs.push_back(h);
    }
    if (activation) plan.activation = *activation;
    if (xent->inputs[1] != y) return std::nullopt;
    plan.loss = xent->outputs[0];
    const Node* xent_bw = reader(plan.layers.back().output, OpKind::softmax_xent_backward, 0);
    if (!xent_bw || xent_bw->inputs[1] != y || !group({xent->id, xent_bw->id}, FusionKind::xent_fused))
      return std::nullopt;
    if (xent_bw->attr<LossGradientAttrs>().scale != 1.0) return std::nullopt;  // (a rank's pre-scaled gradient)

    // Backward and updates, output layer first: dZ is the layer's pre-activation gradient.
    ValueId dz = xent_bw->outputs[0];
    for (std::size_t l = plan.layers.size(); l-- > 0;) {
      WholeStepLayer& layer = plan.layers[l];
      const Node* bias_sum = reader(dz, OpKind::reduce_rows, 0);
      const Node* bias_update = bias_sum ? update_of(layer.bias, bias_sum->outputs[0]) : nullptr;
      const Node* wgrad = reader(dz, OpKind::matmul, 0, [&](const Node& n) {
        return n.attr<MatmulAttrs>().trans_a && !n.attr<MatmulAttrs>().trans_b && n.inputs[1] == inputs[l];
      });
      const Node* weight_update = wgrad ? update_of(layer.weight, wgrad->outputs[0]) : nullptr;
      if (!bias_update || !weight_update || !gradient_and_update(*bias_sum, *bias_update, FusionKind::bgrad_sgd) ||
          !gradient_and_update(*wgrad, *weight_update, FusionKind::wgrad_sgd))
        return std::nullopt;
      layer.bias_update = bias_update->id;
      layer.weight_update = weight_update->id;
      if (l == 0) break;
      const Node* dgrad = reader(dz, OpKind::matmul, 0, [&](const Node& n) {
        return !n.attr<MatmulAttrs>().trans_a && !n.attr<MatmulAttrs>().trans_b && n.inputs[1] == layer.weight;
      });
      const Node* act_bw = dgrad ? reader(dgrad->outputs[0], backward_of(plan.activation), 0) : nullptr;
      if (!act_bw) return std::nullopt;
      // The backward reads the activation's output (relu, tanh, sigmoid) or its input (gelu, gelu_tanh, silu).
      const WholeStepLayer& below = plan.layers[l - 1];
      const bool reads_input = act_bw->inputs[1] == below.pre_activation;
      if ((!reads_input && act_bw->inputs[1] != below.output) ||
          (l + 1 < plan.layers.size() && reads_input != plan.backward_reads_pre_activation))
        return std::nullopt;
      plan.backward_reads_pre_activation = reads_input;
      // In a dgrad group (relu: dgrad_drelu, gelu_tanh: dgrad_dgelu), or both nodes lone.
      if (act_bw->fusion_group >= 0) {
        const FusionKind kind = plan.activation == OpKind::relu ? FusionKind::dgrad_drelu : FusionKind::dgrad_dgelu;
        if (!group({dgrad->id, act_bw->id}, kind)) return std::nullopt;
      } else {
        if (dgrad->fusion_group >= 0) return std::nullopt;
        seen_.insert({dgrad->id, act_bw->id});
      }
      plan.layers[l - 1].pre_activation_grad = act_bw->outputs[0];
      dz = act_bw->outputs[0];
    }
    const Node* advance = only_node(OpKind::advance_step);
    if (!advance || advance->inputs[0] != plan.step) return std::nullopt;
    seen_.insert(advance->id);
    // Nothing else: no other node, and the loss is the only output.
    if (seen_.size() != g_.nodes().size() || g_.outputs() != std::vector<ValueId>{plan.loss}) return std::nullopt;
    return plan;
  }

 private:
  const Node* only_node(OpKind op) const { return sole_node(g_, op); }
  template <typename Extra>
  const Node* reader(ValueId v, OpKind op, std::size_t slot, Extra extra) const {
    return sole_reader(g_, v, op, slot, extra);
  }
  const Node* reader(ValueId v, OpKind op, std::size_t slot) const { return sole_reader(g_, v, op, slot); }

  // The one hidden-layer activation node (kActivationOps) reading `z`.
  const Node* activation_reader(ValueId z) const {
    const Node* found = nullptr;
    for (const ActivationOps& a : kActivationOps)
      if (const Node* n = reader(z, a.forward, 0)) {
        if (found) return nullptr;
        found = n;
      }
    return found;
  }

  static OpKind backward_of(OpKind forward) {
    const std::optional<ActivationOps> a = activation_ops(forward);
    return a ? a->backward : OpKind::relu_backward;  // (always found: `forward` came from kActivationOps)
  }

  // The optimizer update of `param` from `grad`: the one node reading the
  // gradient, an in-place op on `param` (sgd_update with or without momentum
  // state, or an update rule's op: which ones a kernel applies is the
  // backend's question).
  const Node* update_of(ValueId param, ValueId grad) const {
    const std::vector<NodeId>& readers = g_.consumers(grad);
    if (readers.size() != 1) return nullptr;
    const Node& n = g_.node(readers[0]);
    const bool update = op_updates_in_place(n.op) && n.inputs.size() >= 2 && n.inputs[0] == param && n.inputs[1] == grad;
    return update ? &n : nullptr;
  }

  // A gradient and its update: SGD's in one fusion group of `sgd_kind`
  // (wgrad_sgd, bgrad_sgd), any other optimizer's as two lone nodes (its
  // updates run after the last gradient: graph/optimizer_pass.hpp).
  bool gradient_and_update(const Node& gradient, const Node& update, FusionKind sgd_kind) {
    if (update.op == OpKind::sgd_update) return group({gradient.id, update.id}, sgd_kind);
    if (gradient.fusion_group >= 0 || update.fusion_group >= 0) return false;
    seen_.insert({gradient.id, update.id});
    return true;
  }

  // Whether exactly these nodes form one fusion group of `kind`; records them.
  bool group(std::vector<NodeId> nodes, FusionKind kind) {
    const int id = g_.node(nodes.front()).fusion_group;
    if (id < 0) return false;
    const FusionGroup& fg = g_.fusion_groups()[static_cast<std::size_t>(id)];
    std::sort(nodes.begin(), nodes.end());
    if (fg.kind != kind || fg.nodes != nodes) return false;
    seen_.insert(nodes.begin(), nodes.end());
    return true;
  }

  const Graph& g_;
  std::set<NodeId> seen_;
};

}  // namespace

std::optional<WholeStepPlan> match_whole_step(const Graph& graph) { return StepWalker(graph).run(); }

}  // namespace sg
