#include "runtime/plan/cnn_step_pattern.hpp"

#include <fmt/format.h>

#include <set>

#include "runtime/plan/graph_queries.hpp"

namespace sg {
namespace {

using Kind = CnnStepLayerKind;

// Thrown inside the walker when the graph is not the expected step; caught
// by match_cnn_step, which turns it into `why_not`.
struct NoMatch {
  std::string why;
};

// Walks the graph from the batch fetch through the forward chain, then back
// from the loss through each layer's backward, collecting every node it
// expects; any surprise ends the match.
class CnnStepWalker {
 public:
  explicit CnnStepWalker(const Graph& g) : g_(g) {}

  CnnStepPlan run() {
    CnnStepPlan plan;
    const ValueId x = fetch(plan);
    ValueId h = x;
    const Node* xent = nullptr;
    while (!xent) {
      xent = reader(h, OpKind::softmax_xent, 0);
      if (!xent) h = forward_layer(h, plan);
    }
    if (plan.layers.empty() || plan.layers.back().kind != Kind::linear)
      throw NoMatch{"the loss does not read a linear layer"};
    // An MLP has its own whole-step and per-launch kernels, which are faster
    // for wide layers than per-example matrix-vector products.
    bool conv = false;
    for (const CnnStepLayer& l : plan.layers) conv = conv || l.kind == Kind::conv2d;
    if (!conv) throw NoMatch{"no conv2d layer"};
    plan.logits = h;
    plan.loss = xent->outputs[0];
    const ValueId y = labels_->outputs[0];
    if (xent->inputs[1] != y) throw NoMatch{"the loss does not read the fetched labels"};
    seen_.insert(xent->id);
    const Node* xent_bw = reader(h, OpKind::softmax_xent_backward, 0);
    if (!xent_bw || xent_bw->inputs[1] != y) throw NoMatch{"no softmax_xent_backward of the logits"};
    seen_.insert(xent_bw->id);
    plan.gradient_scale = xent_bw->attr<LossGradientAttrs>().scale;

    // The first layer with parameters needs no input gradient; layers before
    // it (the reshape of the fetched rows) have no backward at all.
    std::size_t first_param = plan.layers.size();
    for (std::size_t i = 0; i < plan.layers.size(); ++i)
      if (has_params(plan.layers[i])) {
        first_param = i;
        break;
      }
    ValueId g = xent_bw->outputs[0];
    for (std::size_t i = plan.layers.size(); i-- > first_param;) {
      CnnStepLayer& layer = plan.layers[i];
      layer.input_gradient = i > first_param;
      g = backward_layer(layer, g);
    }
    check_all_reduces();
    plan.gradients_reduced = reduced_;
    if (plan.ranks != 1 && !reduced_) throw NoMatch{"a data-parallel shard whose gradients are not all-reduced"};
    const Node* advance = only_node(OpKind::advance_step);
    if (!advance || advance->inputs[0] != plan.step) throw NoMatch{"no step advance"};
    seen_.insert(advance->id);
    if (seen_.size() != g_.nodes().size())
      for (const Node& n : g_.nodes())
        if (!seen_.count(n.id)) throw NoMatch{fmt::format("node {} ({}) is not part of the pattern", n.id, op_name(n.op))};
    if (g_.outputs() != std::vector<ValueId>{plan.loss}) throw NoMatch{"the graph has outputs besides the loss"};
    return plan;
  }

 private:
  // The backward ops' attrs also hold the size of what they compute (grad_h, grad_w).
  static bool same_geometry(const Conv2dAttrs& a, const Conv2dAttrs& b) {
    return a.stride == b.stride && a.padding == b.padding;
  }
  static bool has_params(const CnnStepLayer& l) { return l.kind == Kind::conv2d || l.kind == Kind::linear; }

  // batch_indices + gather_rows of u8 images and u8 labels; returns the fetched rows.
  ValueId fetch(CnnStepPlan& plan) {
    const Node* indices = only_node(OpKind::batch_indices);
    if (!indices) throw NoMatch{"no single batch fetch"};
    plan.rank = indices->attr<BatchIndicesAttrs>().rank;
    plan.ranks = indices->attr<BatchIndicesAttrs>().ranks;
    plan.perm = indices->inputs[0];
    plan.step = indices->inputs[1];
    plan.batch = indices->attr<BatchIndicesAttrs>().batch;
    const Node* images = nullptr;
    for (NodeId id : g_.consumers(indices->outputs[0])) {
      const Node& n = g_.node(id);
      if (n.op != OpKind::gather_rows) throw NoMatch{"the batch indices feed something besides the fetch"};
      (g_.value(n.outputs[0]).dtype == DType::i32 ? labels_ : images) = &n;
    }
    if (!images || !labels_ || g_.consumers(indices->outputs[0]).size() != 2) throw NoMatch{"not one image and one label fetch"};
    plan.images = images->inputs[0];
    plan.labels = labels_->inputs[0];
    if (g_.value(plan.images).dtype != DType::u8 || g_.value(plan.labels).dtype != DType::u8)
      throw NoMatch{"the fetched tables are not u8 images and u8 labels"};
    plan.input_scale = images->attr<GatherRowsAttrs>().scale;
    plan.input_shift = images->attr<GatherRowsAttrs>().shift;
    seen_.insert({indices->id, images->id, labels_->id});
    return images->outputs[0];
  }

  // The one forward layer reading `h`; appends it and returns its output.
  ValueId forward_layer(ValueId h, CnnStepPlan& plan) {
    const Node* next = nullptr;
    for (NodeId id : g_.consumers(h)) {
      const Node& n = g_.node(id);
      if (n.inputs.empty() || n.inputs[0] != h) continue;
      const bool forward = n.op == OpKind::conv2d || n.op == OpKind::max_pool2d || activation_ops(n.op) ||
                           n.op == OpKind::dropout2d || n.op == OpKind::dropout || n.op == OpKind::flatten ||
                           n.op == OpKind::reshape ||
                           (n.op == OpKind::matmul && !n.attr<MatmulAttrs>().trans_a && n.attr<MatmulAttrs>().trans_b);
      if (!forward) continue;
      if (next) throw NoMatch{fmt::format("value {} feeds two forward layers", g_.value(h).name)};
      next = &n;
    }
    if (!next) throw NoMatch{fmt::format("no forward layer reads {}", g_.value(h).name)};
    CnnStepLayer layer;
    layer.input = h;
    seen_.insert(next->id);
    switch (next->op) {
      case OpKind::conv2d: {
        layer.kind = Kind::conv2d;
        layer.conv = next->attr<Conv2dAttrs>();
        if (next->inputs.size() != 3) throw NoMatch{"a conv2d without bias"};
        if (layer.conv.channels_last) throw NoMatch{"channels-last activations (its kernels are NCHW)"};
        layer.weight = master_of(next->inputs[1]);
        layer.bias = master_of(next->inputs[2]);
        layer.output = next->outputs[0];
        break;
      }
      case OpKind::matmul: {
        layer.kind = Kind::linear;
        layer.weight = master_of(next->inputs[1]);
        const Node* add = reader(next->outputs[0], OpKind::bias_add, 0);
        if (!add || g_.consumers(next->outputs[0]).size() != 1) throw NoMatch{"a linear layer without bias"};
        seen_.insert(add->id);
        layer.bias = master_of(add->inputs[1]);
        layer.output = add->outputs[0];
        break;
      }
      case OpKind::max_pool2d:
        layer.kind = Kind::max_pool2d;
        layer.pool = next->attr<Pool2dAttrs>();
        if (layer.pool.channels_last) throw NoMatch{"channels-last activations (its kernels are NCHW)"};
        layer.output = next->outputs[0];
        break;
      case OpKind::relu:
        layer.kind = Kind::relu;
        layer.output = next->outputs[0];
        break;
      case OpKind::gelu:
      case OpKind::gelu_tanh:
      case OpKind::silu:
      case OpKind::tanh:
      case OpKind::sigmoid:
        layer.kind = Kind::activation;
        layer.activation = next->op;
        layer.output = next->outputs[0];
        break;
      case OpKind::dropout2d:
      case OpKind::dropout:
        layer.kind = next->op == OpKind::dropout ? Kind::dropout : Kind::dropout2d;
        if (next->inputs[1] != plan.step) throw NoMatch{"a dropout not keyed by the step counter"};
        layer.dropout = next->attr<DropoutAttrs>();
        layer.output = next->outputs[0];
        break;
      default:  // flatten, reshape: the same bytes per example
        layer.kind = Kind::view;
        layer.output = next->outputs[0];
        break;
    }
    plan.layers.push_back(layer);
    return layer.output;
  }

  // The fp32 master parameter behind a forward operand: cast(param f32).
  ValueId master_of(ValueId operand) {
    const Value& v = g_.value(operand);
    if (v.producer < 0) throw NoMatch{fmt::format("{} is not a cast parameter (fp32 master weights)", v.name)};
    const Node& cast = g_.node(v.producer);
    if (cast.op != OpKind::cast || g_.value(cast.inputs[0]).role != Role::param ||
        g_.value(cast.inputs[0]).dtype != DType::f32)
      throw NoMatch{fmt::format("{} is not a cast parameter (fp32 master weights)", v.name)};
    seen_.insert(cast.id);
    return cast.inputs[0];
  }

  // The backward of `layer` from the gradient of its output; returns the
  // gradient of its input (or -1 when it has none).
  ValueId backward_layer(CnnStepLayer& layer, ValueId g) {
    const auto one = [&](OpKind op, std::size_t slot = 0) {
      const Node* n = reader(g, op, slot);
      if (!n) throw NoMatch{fmt::format("no {} reading {}", op_name(op), g_.value(g).name)};
      seen_.insert(n->id);
      return n;
    };
    switch (layer.kind) {
      case Kind::conv2d: {
        const Node* filter = one(OpKind::conv2d_backward_filter);
        if (filter->inputs[1] != layer.input || !same_geometry(filter->attr<Conv2dAttrs>(), layer.conv))
          throw NoMatch{"a conv2d_backward_filter not of its conv2d"};
        layer.weight_update = update_of(layer.weight, filter->outputs[0], layer.weight_gradient);
        layer.bias_update = update_of(layer.bias, one(OpKind::channel_sum)->outputs[0], layer.bias_gradient);
        if (!layer.input_gradient) return -1;
        const Node* data = one(OpKind::conv2d_backward_data);
        if (g_.value(data->inputs[1]).producer < 0 || g_.node(g_.value(data->inputs[1]).producer).inputs[0] != layer.weight ||
            !same_geometry(data->attr<Conv2dAttrs>(), layer.conv))
          throw NoMatch{"a conv2d_backward_data not of its conv2d"};
        return data->outputs[0];
      }
      case Kind::linear: {
        const Node* sum = one(OpKind::reduce_rows);
        layer.bias_update = update_of(layer.bias, sum->outputs[0], layer.bias_gradient);
        const Node* wgrad = nullptr;
        const Node* dgrad = nullptr;
        for (NodeId id : g_.consumers(g)) {
          const Node& n = g_.node(id);
          if (n.op != OpKind::matmul || n.inputs[0] != g) continue;
          const auto& a = n.attr<MatmulAttrs>();
          if (a.trans_a && !a.trans_b && n.inputs[1] == layer.input) wgrad = &n;
          else if (!a.trans_a && !a.trans_b && g_.value(n.inputs[1]).producer >= 0 &&
                   g_.node(g_.value(n.inputs[1]).producer).inputs[0] == layer.weight)
            dgrad = &n;
          else
            throw NoMatch{"an unexpected matmul of a linear layer's gradient"};
        }
        if (!wgrad) throw NoMatch{"a linear layer without its weight-gradient matmul"};
        seen_.insert(wgrad->id);
        layer.weight_update = update_of(layer.weight, wgrad->outputs[0], layer.weight_gradient);
        if (!layer.input_gradient) return -1;
        if (!dgrad) throw NoMatch{"a linear layer without its data-gradient matmul"};
        seen_.insert(dgrad->id);
        return dgrad->outputs[0];
      }
      case Kind::max_pool2d: {
        const Node* n = one(OpKind::max_pool2d_backward);
        if (n->inputs[1] != layer.input || !(n->attr<Pool2dAttrs>() == layer.pool))
          throw NoMatch{"a max_pool2d_backward not of its max_pool2d"};
        return n->outputs[0];
      }
      case Kind::relu:
      case Kind::activation: {
        const ActivationOps ops = *activation_ops(layer.kind == Kind::relu ? OpKind::relu : layer.activation);
        const Node* n = one(ops.backward);
        if (n->inputs[1] != (ops.backward_reads_input ? layer.input : layer.output))
          throw NoMatch{fmt::format("a {} not of its {}", op_name(ops.backward), op_name(ops.forward))};
        return n->outputs[0];
      }
      case Kind::dropout:
      case Kind::dropout2d: {
        const Node* n = one(layer.kind == Kind::dropout ? OpKind::dropout_backward : OpKind::dropout2d_backward);
        if (n->inputs[1] != g_.node(g_.value(layer.output).producer).inputs[1] ||
            !(n->attr<DropoutAttrs>() == layer.dropout))
          throw NoMatch{"a dropout backward not of its dropout"};
        return n->outputs[0];
      }
      case Kind::view: {
        const Node* n = one(OpKind::reshape);
        if (g_.value(n->outputs[0]).shape != g_.value(layer.input).shape) throw NoMatch{"a view's gradient of another shape"};
        return n->outputs[0];
      }
    }
    throw NoMatch{"unknown layer"};
  }

  // The optimizer update (any op that updates in place: sgd_update or an
  // update rule's) of `param` from cast(grad) to f32, directly or through an
  // all_reduce_mean (data parallel: every gradient or none); returns its node
  // and sets `gradient` to the cast's output. Which updates the kernels apply
  // is the backend's question (its why_not).
  NodeId update_of(ValueId param, ValueId grad, ValueId& gradient) {
    const std::vector<NodeId>& grad_readers = g_.consumers(grad);
    if (grad_readers.size() == 1 && g_.node(grad_readers[0]).op == OpKind::all_reduce_mean)
      throw NoMatch{"gradients all-reduced in the compute dtype (precision.all_reduce: compute): the step's "
                    "kernels hand the reduction fp32 gradients"};
    const Node* cast = reader(grad, OpKind::cast, 0);
    if (!cast || g_.value(cast->outputs[0]).dtype != DType::f32 || grad_readers.size() != 1)
      throw NoMatch{fmt::format("the gradient {} is not cast to fp32 for its update", g_.value(grad).name)};
    gradient = cast->outputs[0];
    ValueId applied = gradient;  // what the update reads
    const std::vector<NodeId>& cast_readers = g_.consumers(gradient);
    const bool reduced = cast_readers.size() == 1 && g_.node(cast_readers[0]).op == OpKind::all_reduce_mean;
    if (!updates_seen_.empty() && reduced != reduced_) throw NoMatch{"some gradients are all-reduced and some not"};
    reduced_ = reduced;
    if (reduced) {
      const Node& all_reduce = g_.node(cast_readers[0]);
      if (all_reduce.attr<AllReduceAttrs>().shards > 1)
        throw NoMatch{"sharded updates (data_parallel.zero1): the step's kernels update whole parameters"};
      for (std::size_t k = 0; k < all_reduce.inputs.size(); ++k)
        if (all_reduce.inputs[k] == gradient) applied = all_reduce.outputs[k];
      seen_.insert(all_reduce.id);
      all_reduces_.insert(all_reduce.id);
      reduced_gradients_.insert(gradient);
    }
    const std::vector<NodeId>& readers = g_.consumers(applied);
    const Node* update = readers.size() == 1 ? &g_.node(readers[0]) : nullptr;
    if (!update || !op_updates_in_place(update->op) || update->inputs.size() < 2 || update->inputs[0] != param ||
        update->inputs[1] != applied)
      throw NoMatch{fmt::format("{} is not updated by an optimizer from its gradient alone", g_.value(param).name)};
    seen_.insert({cast->id, update->id});
    updates_seen_.insert(update->id);
    return update->id;
  }

  // Every all_reduce_mean reduces gradients of this step's parameters only.
  void check_all_reduces() const {
    for (NodeId id : all_reduces_)
      for (ValueId v : g_.node(id).inputs)
        if (!reduced_gradients_.count(v)) throw NoMatch{"an all-reduce of something besides the parameters' gradients"};
  }

  const Node* only_node(OpKind op) const { return sole_node(g_, op); }
  const Node* reader(ValueId v, OpKind op, std::size_t slot) const { return sole_reader(g_, v, op, slot); }

  const Graph& g_;
  const Node* labels_ = nullptr;
  std::set<NodeId> seen_;
  std::set<NodeId> updates_seen_, all_reduces_;
  std::set<ValueId> reduced_gradients_;
  bool reduced_ = false;
};

}  // namespace

CnnStepMatch match_cnn_step(const Graph& graph) {
  try {
    return {CnnStepWalker(graph).run(), {}};
  } catch (const NoMatch& e) {
    return {std::nullopt, e.why};
  }
}

}  // namespace sg
