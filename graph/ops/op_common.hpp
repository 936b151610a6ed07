#pragma once
// Shared by the op files under graph/ops/: shape-rule checks (errors name the
// op and the shapes), the JSON/text codecs of each attribute kind, and the
// accessors of every op's registry entry (listed in op_registry.cpp).
#include <span>
#include <string>
#include <vector>

#include "graph/op_registry.hpp"
#include "ops/cpu/reference_ops.hpp"

namespace sg::ops {

using Inputs = std::vector<const Value*>;

[[noreturn]] void fail(OpKind op, const std::string& what);
std::string describe(const Value& v);  // "'x' [32,784] f16"
void expect_arity(OpKind op, const Inputs& in, std::size_t lo, std::size_t hi);
void expect_rank(OpKind op, const Value& v, std::size_t rank);
void expect_floating(OpKind op, const Value& v);
void expect_same_dtype(OpKind op, const Value& a, const Value& b);
void expect_same_shape(OpKind op, const Value& a, const Value& b);
void expect_labels_for(OpKind op, const Value& logits, const Value& labels);
// A loss backward's gradient scale (LossGradientAttrs): finite and > 0.
void expect_gradient_scale(OpKind op, double scale);
// Multiplies a loss backward's CPU output by its gradient scale (after the
// reference computed the gradient of the mean loss).
template <typename T>
void scale_loss_gradient(const CpuTensor<T>& out, double scale) {
  if (scale == 1.0) return;
  for (std::int64_t i = 0; i < out.size; ++i) out.real[i] *= static_cast<T>(scale);
}
// Two floating inputs of one shape and dtype -> one output like them
// (add, relu_backward, gelu_backward).
std::vector<OutputSpec> infer_binary_same(OpKind op, const Inputs& in);
// One floating input -> one output like it (relu, gelu).
std::vector<OutputSpec> infer_unary_same(OpKind op, const Inputs& in);
// (X [M,N], b [N]) -> one output like X: bias_add's rule (bias_add.cpp),
// shared with bias_add_relu.
std::vector<OutputSpec> infer_bias_add(OpKind op, const Inputs& in);
// The gradient rule of a normalisation (X, gamma, beta) -> Y: one `backward`
// node (dY, X, gamma) with the node's attributes, whose outputs (dX,
// dgamma, dbeta) go to the inputs that need them (layer_norm, batch_norm).
void normalisation_gradient(const GradientContext& c, OpKind backward);
// The product of shape[first..] (1 when first >= rank): the values of one
// row (first = 1) or of one channel (first = 2) of an [N, C, ...] value.
std::int64_t elements_from(std::span<const std::int64_t> shape, std::size_t first);

// JSON and text of each attribute kind. attrs_text lists only what the
// output types do not already show, so dump lines stay short.
#define SG_ATTR_CODEC(A)                          \
  nlohmann::json write_attrs(const A& a);         \
  void read_attrs(const nlohmann::json& j, A& a); \
  std::string attrs_text(const A& a);
SG_ATTR_CODEC(NoAttrs)
SG_ATTR_CODEC(BatchIndicesAttrs)
SG_ATTR_CODEC(GatherRowsAttrs)
SG_ATTR_CODEC(MatmulAttrs)
SG_ATTR_CODEC(CastAttrs)
SG_ATTR_CODEC(SgdUpdateAttrs)
SG_ATTR_CODEC(LabelSmoothingAttrs)
SG_ATTR_CODEC(DropoutAttrs)
SG_ATTR_CODEC(AdamUpdateAttrs)
SG_ATTR_CODEC(ClipGradAttrs)
SG_ATTR_CODEC(Conv2dAttrs)
SG_ATTR_CODEC(Pool2dAttrs)
SG_ATTR_CODEC(ReshapeAttrs)
SG_ATTR_CODEC(RmspropUpdateAttrs)
SG_ATTR_CODEC(LayerNormAttrs)
SG_ATTR_CODEC(SliceAttrs)
SG_ATTR_CODEC(AugmentAttrs)
SG_ATTR_CODEC(BatchNormAttrs)
SG_ATTR_CODEC(LossGradientAttrs)
SG_ATTR_CODEC(AllReduceAttrs)
#undef SG_ATTR_CODEC

// `def` with the attribute kind A and its codec filled in.
template <typename A>
OpDef with_attrs(OpDef def) {
  def.attrs_index = attrs_index<A>();
  def.attrs_to_json = [](const OpAttrs& a) { return write_attrs(std::get<A>(a)); };
  def.attrs_from_json = [](const nlohmann::json& j) {
    A a;
    read_attrs(j, a);
    return OpAttrs{a};
  };
  def.attrs_text = [](const OpAttrs& a) { return attrs_text(std::get<A>(a)); };
  return def;
}

// ---- every entry (one accessor per op, defined in its file)
const OpDef& batch_indices_def();
const OpDef& gather_rows_def();
const OpDef& matmul_def();
const OpDef& bias_add_def();
const OpDef& relu_def();
const OpDef& relu_backward_def();
const OpDef& softmax_xent_def();
const OpDef& softmax_xent_backward_def();
const OpDef& reduce_rows_def();
const OpDef& add_def();
const OpDef& cast_def();
const OpDef& sgd_update_def();
const OpDef& advance_step_def();
const OpDef& count_correct_def();
const OpDef& gelu_def();
const OpDef& gelu_backward_def();
const OpDef& bias_add_relu_def();
// issue 21: activations, regression losses, label smoothing, dropout
const OpDef& gelu_tanh_def();
const OpDef& gelu_tanh_backward_def();
const OpDef& silu_def();
const OpDef& silu_backward_def();
const OpDef& tanh_def();
const OpDef& tanh_backward_def();
const OpDef& sigmoid_def();
const OpDef& sigmoid_backward_def();
const OpDef& mse_loss_def();
const OpDef& mse_loss_backward_def();
const OpDef& l1_loss_def();
const OpDef& l1_loss_backward_def();
const OpDef& softmax_xent_smoothed_def();
const OpDef& softmax_xent_smoothed_backward_def();
const OpDef& dropout_def();
const OpDef& dropout_backward_def();
// issue 21: optimizers and gradient clipping
const OpDef& adam_update_def();
const OpDef& rmsprop_update_def();
const OpDef& grad_clip_scale_def();
const OpDef& scale_grad_def();
// issue 22: convolutional networks
const OpDef& conv2d_def();
const OpDef& conv2d_backward_data_def();
const OpDef& conv2d_backward_filter_def();
const OpDef& channel_sum_def();
const OpDef& max_pool2d_def();
const OpDef& max_pool2d_backward_def();
const OpDef& flatten_def();
const OpDef& reshape_def();
const OpDef& dropout2d_def();
const OpDef& dropout2d_backward_def();
// issue 25: data-parallel training
const OpDef& all_reduce_mean_def();
// issue 37: mean pooling
const OpDef& avg_pool2d_def();
const OpDef& avg_pool2d_backward_def();
const OpDef& global_avg_pool2d_def();
const OpDef& global_avg_pool2d_backward_def();
// issue 37: normalisation
const OpDef& layer_norm_def();
const OpDef& layer_norm_backward_def();
// issue 37: merging branches
const OpDef& concat_def();
const OpDef& slice_channels_def();
// issue 37: training-batch augmentation
const OpDef& augment_images_def();
// issue 37: batch normalisation
const OpDef& batch_norm_def();
const OpDef& batch_norm_backward_def();
const OpDef& batch_norm_stats_update_def();
const OpDef& batch_norm_inference_def();
// issues 36, 37: activation layouts
const OpDef& to_channels_last_def();
const OpDef& to_channels_first_def();
const OpDef& all_gather_shards_def();
const OpDef& all_gather_batch_def();

}  // namespace sg::ops
