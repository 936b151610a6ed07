// Batch normalisation (issue 37), PyTorch's BatchNorm1d ([N, C]) and
// BatchNorm2d ([N, C, H, W]) in four ops:
//   batch_norm (training): each channel normalised by the batch's mean and
//     biased variance over N (and H, W), then scaled by gamma, shifted by beta;
//   batch_norm_backward: (dY, X, gamma) -> (dX, dgamma, dbeta), the batch
//     statistics recomputed from X (as layer_norm_backward: the forward
//     stays one output, nothing is saved);
//   batch_norm_stats_update: the running mean and (unbiased) variance moved
//     towards the batch's in place, once per training step;
//   batch_norm_inference (eval, predict): normalised by the running statistics.
#include <fmt/format.h>

#include "graph/ops/op_common.hpp"
#include "ops/cpu/norm_reference.hpp"

namespace sg::ops {
namespace {

// X [N, C, ...] (or [N, H, W, C]) with per-channel [C] values of one floating dtype; valid attributes.
void check_channels(OpKind op, const Value& x, std::initializer_list<const Value*> per_channel, const OpAttrs& attrs) {
  expect_floating(op, x);
  const auto& a = std::get<BatchNormAttrs>(attrs);
  if (a.channels_last && x.shape.size() != 4)
    fail(op, fmt::format("{} must be [N, H, W, C] (channels_last)", describe(x)));
  if (x.shape.size() != 2 && x.shape.size() != 4)
    fail(op, fmt::format("{} must be [N, C] or [N, C, H, W]", describe(x)));
  const std::int64_t channels = batch_norm_layout(x.shape, a).channels;
  for (const Value* v : per_channel) {
    expect_floating(op, *v);
    if (v->shape != Shape{channels})
      fail(op, fmt::format("{} must be [{}], one value per channel of {}", describe(*v), channels, describe(x)));
  }
  if (!(a.eps > 0.0)) fail(op, fmt::format("eps {} must be > 0", a.eps));
  if (!(a.momentum >= 0.0 && a.momentum <= 1.0)) fail(op, fmt::format("momentum {} must be in [0, 1]", a.momentum));
}

// Training needs more than one value per channel (PyTorch refuses one, too).
void check_batch(OpKind op, const Value& x, const OpAttrs& attrs) {
  const BatchNormLayout l = batch_norm_layout(x.shape, std::get<BatchNormAttrs>(attrs));
  if (l.n * l.plane < 2)
    fail(op, fmt::format("{} has one value per channel: batch statistics need more than one", describe(x)));
}

std::vector<OutputSpec> infer_train(const Inputs& in, const OpAttrs& attrs) {
  constexpr OpKind op = OpKind::batch_norm;
  expect_arity(op, in, 3, 3);
  check_channels(op, *in[0], {in[1], in[2]}, attrs);
  check_batch(op, *in[0], attrs);
  return {{in[0]->shape, in[0]->dtype}};
}

std::vector<OutputSpec> infer_backward(const Inputs& in, const OpAttrs& attrs) {
  constexpr OpKind op = OpKind::batch_norm_backward;
  expect_arity(op, in, 3, 3);
  check_channels(op, *in[1], {in[2]}, attrs);
  expect_same_shape(op, *in[0], *in[1]);
  expect_same_dtype(op, *in[0], *in[1]);
  return {{in[1]->shape, in[1]->dtype}, {in[2]->shape, in[2]->dtype}, {in[2]->shape, in[2]->dtype}};
}

std::vector<OutputSpec> infer_stats_update(const Inputs& in, const OpAttrs& attrs) {
  constexpr OpKind op = OpKind::batch_norm_stats_update;
  expect_arity(op, in, 3, 3);
  check_channels(op, *in[0], {in[1], in[2]}, attrs);
  check_batch(op, *in[0], attrs);
  return {};
}

std::vector<OutputSpec> infer_inference(const Inputs& in, const OpAttrs& attrs) {
  constexpr OpKind op = OpKind::batch_norm_inference;
  expect_arity(op, in, 5, 5);
  check_channels(op, *in[0], {in[1], in[2], in[3], in[4]}, attrs);
  return {{in[0]->shape, in[0]->dtype}};
}

void gradient(const GradientContext& c) { normalisation_gradient(c, OpKind::batch_norm_backward); }

std::vector<int> stats_in_place(const OpAttrs&, int) { return {1, 2}; }

BatchNormLayout layout_of(std::span<const std::int64_t> s, const Node& node) {
  return batch_norm_layout(s, node.attr<BatchNormAttrs>());
}

template <typename T>
void train_cpu(const CpuCall<T>& c) {
  const auto l = layout_of(c.in[0].shape, c.node);
  ref::batch_norm(c.in[0].real, c.in[1].real, c.in[2].real, l.n, l.channels, l.plane,
                  c.node.template attr<BatchNormAttrs>().eps, c.out[0].real);
}

template <typename T>
void backward_cpu(const CpuCall<T>& c) {
  const auto l = layout_of(c.in[1].shape, c.node);
  ref::batch_norm_backward(c.in[0].real, c.in[1].real, c.in[2].real, l.n, l.channels, l.plane,
                           c.node.template attr<BatchNormAttrs>().eps, c.out[0].real, c.out[1].real, c.out[2].real);
}

template <typename T>
void stats_update_cpu(const CpuCall<T>& c) {
  const auto l = layout_of(c.in[0].shape, c.node);
  ref::batch_norm_stats_update(c.in[0].real, l.n, l.channels, l.plane, c.node.template attr<BatchNormAttrs>().momentum,
                               c.in[1].real, c.in[2].real);
}

template <typename T>
void inference_cpu(const CpuCall<T>& c) {
  const auto l = layout_of(c.in[0].shape, c.node);
  ref::batch_norm_inference(c.in[0].real, c.in[1].real, c.in[2].real, c.in[3].real, c.in[4].real, l.n, l.channels,
                            l.plane, c.node.template attr<BatchNormAttrs>().eps, c.out[0].real);
}

}  // namespace

const OpDef& batch_norm_def() {
  static const OpDef def = with_attrs<BatchNormAttrs>({.kind = OpKind::batch_norm, .name = "batch_norm",
                                                       .infer = &infer_train, .gradient = &gradient,
                                                       .cpu_f32 = &train_cpu<float>, .cpu_f64 = &train_cpu<double>});
  return def;
}

const OpDef& batch_norm_backward_def() {
  static const OpDef def = with_attrs<BatchNormAttrs>(
      {.kind = OpKind::batch_norm_backward, .name = "batch_norm_backward", .infer = &infer_backward,
       .cpu_f32 = &backward_cpu<float>, .cpu_f64 = &backward_cpu<double>});
  return def;
}

const OpDef& batch_norm_stats_update_def() {
  static const OpDef def = with_attrs<BatchNormAttrs>(
      {.kind = OpKind::batch_norm_stats_update, .name = "batch_norm_stats_update", .infer = &infer_stats_update,
       .in_place = &stats_in_place, .cpu_f32 = &stats_update_cpu<float>, .cpu_f64 = &stats_update_cpu<double>});
  return def;
}

const OpDef& batch_norm_inference_def() {
  static const OpDef def = with_attrs<BatchNormAttrs>(
      {.kind = OpKind::batch_norm_inference, .name = "batch_norm_inference", .infer = &infer_inference,
       .cpu_f32 = &inference_cpu<float>, .cpu_f64 = &inference_cpu<double>});
  return def;
}

}  // namespace sg::ops
