#include "graph/op_registry.hpp"

#include <vector>

#include <fmt/format.h>

#include "graph/ops/op_common.hpp"

namespace sg {
namespace {

// Every op's entry, in OpKind order (checked on first use; a new op appends
// its entry, no count to edit: op_def throws for a kind past the end).
const std::vector<const OpDef*>& table() {
  static const std::vector<const OpDef*> entries = [] {
    std::vector<const OpDef*> t = {
        &ops::batch_indices_def(), &ops::gather_rows_def(),  &ops::matmul_def(),
        &ops::bias_add_def(),      &ops::relu_def(),         &ops::relu_backward_def(),
        &ops::softmax_xent_def(),  &ops::softmax_xent_backward_def(), &ops::reduce_rows_def(),
        &ops::add_def(),           &ops::cast_def(),         &ops::sgd_update_def(),
        &ops::advance_step_def(),  &ops::count_correct_def(), &ops::gelu_def(),
        &ops::gelu_backward_def(), &ops::bias_add_relu_def(),
        // issue 21: activations, regression losses, label smoothing, dropout
        &ops::gelu_tanh_def(), &ops::gelu_tanh_backward_def(), &ops::silu_def(), &ops::silu_backward_def(),
        &ops::tanh_def(), &ops::tanh_backward_def(), &ops::sigmoid_def(), &ops::sigmoid_backward_def(),
        &ops::mse_loss_def(), &ops::mse_loss_backward_def(), &ops::l1_loss_def(), &ops::l1_loss_backward_def(),
        &ops::softmax_xent_smoothed_def(), &ops::softmax_xent_smoothed_backward_def(), &ops::dropout_def(),
        &ops::dropout_backward_def(),
        // issue 21: optimizers and gradient clipping
        &ops::adam_update_def(), &ops::grad_clip_scale_def(), &ops::scale_grad_def(),
        // issue 22: convolutional networks
        &ops::conv2d_def(), &ops::conv2d_backward_data_def(), &ops::conv2d_backward_filter_def(),
        &ops::channel_sum_def(), &ops::max_pool2d_def(), &ops::max_pool2d_backward_def(), &ops::flatten_def(),
        &ops::reshape_def(), &ops::dropout2d_def(), &ops::dropout2d_backward_def(),
        // issue 25: data-parallel training
        &ops::all_reduce_mean_def(),
        // issue 35: update rules on the update stage
        &ops::rmsprop_update_def(),
        // issue 37: mean pooling
        &ops::avg_pool2d_def(), &ops::avg_pool2d_backward_def(), &ops::global_avg_pool2d_def(),
        &ops::global_avg_pool2d_backward_def(),
        // issue 37: normalisation
        &ops::layer_norm_def(), &ops::layer_norm_backward_def(),
        // issue 37: merging branches
        &ops::concat_def(), &ops::slice_channels_def(),
        // issue 37: training-batch augmentation
        &ops::augment_images_def(),
        // issue 37: batch normalisation
        &ops::batch_norm_def(), &ops::batch_norm_backward_def(), &ops::batch_norm_stats_update_def(),
        &ops::batch_norm_inference_def(),
        // issues 36, 37: activation layouts
        &ops::to_channels_last_def(), &ops::to_channels_first_def(),
        // issue 38: sharded updates (ZeRO-1)
        &ops::all_gather_shards_def(),
        // issue 38: weight gradients from every rank's rows
        &ops::all_gather_batch_def(),
    };
    for (std::size_t i = 0; i < t.size(); ++i)
      if (static_cast<std::size_t>(t[i]->kind) != i || t[i]->name.empty() || !t[i]->infer)
        throw std::logic_error(fmt::format("op registry: entry {} ({}) is out of place or incomplete", i, t[i]->name));
    return t;
  }();
  return entries;
}

}  // namespace

const OpDef& op_def(OpKind op) {
  const auto i = static_cast<std::size_t>(op);
  if (i >= table().size()) throw GraphError(fmt::format("op registry: no entry for op kind {}", i));
  return *table()[i];
}

std::span<const OpDef* const> all_op_defs() { return table(); }

nlohmann::json attrs_to_json(OpKind op, const OpAttrs& attrs) {
  const OpDef& def = op_def(op);
  if (attrs.index() != def.attrs_index)
    throw GraphError(fmt::format("{}: attributes are {}, expected {}", def.name, attrs_kind_name(attrs),
                                 attrs_kind_name(def.attrs_index)));
  return def.attrs_to_json(attrs);
}

OpAttrs attrs_from_json(OpKind op, const nlohmann::json& j) { return op_def(op).attrs_from_json(j); }

std::string attrs_text(OpKind op, const OpAttrs& attrs) {
  const OpDef& def = op_def(op);
  if (attrs.index() != def.attrs_index) return fmt::format(" {{{} attributes?}}", attrs_kind_name(attrs));
  return def.attrs_text(attrs);
}

// ---- gradient rules' view of a node

GradientContext::GradientContext(Graph& graph, const Node& node, std::vector<std::optional<ValueId>> output_grads,
                                 std::vector<bool> input_needs_grad, Sink contribute)
    : graph_(graph),
      node_(node),
      output_grads_(std::move(output_grads)),
      needs_(std::move(input_needs_grad)),
      sink_(std::move(contribute)) {}

ValueId GradientContext::input(int slot) const { return node_.inputs.at(static_cast<std::size_t>(slot)); }
ValueId GradientContext::output(int slot) const { return node_.outputs.at(static_cast<std::size_t>(slot)); }
std::optional<ValueId> GradientContext::output_grad(int slot) const {
  return output_grads_.at(static_cast<std::size_t>(slot));
}
bool GradientContext::needs_grad(int slot) const { return needs_.at(static_cast<std::size_t>(slot)); }
std::string GradientContext::grad_name(ValueId value) const { return "grad_" + graph_.value(value).name; }

std::vector<ValueId> GradientContext::emit(OpKind op, std::vector<ValueId> inputs, OpAttrs attrs,
                                           ValueId named_after) const {
  return graph_.append_node(op, std::move(inputs), attrs, Role::grad, grad_name(named_after));
}

void GradientContext::contribute(int slot, ValueId grad) const { sink_(input(slot), grad); }

}  // namespace sg
