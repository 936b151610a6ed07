// softmax_xent_smoothed: (logits [B,C], labels i32[B]) -> mean cross-entropy
// against the smoothed target (1 - eps) onehot + eps / C, f32[1] (PyTorch
// CrossEntropyLoss(label_smoothing=eps)), a loss; its backward: (logits,
// labels) -> (softmax - smoothed target) / B, times its gradient_scale (1/N
// in a data-parallel rank of N; the forward op keeps 1). A separate op from
// softmax_xent so that the lowerings written for plain cross-entropy (the
// fused output-layer and whole-step kernels) never take it.
#include "graph/ops/op_common.hpp"

namespace sg::ops {
namespace {

std::vector<OutputSpec> infer_loss(const Inputs& in, const OpAttrs& attrs) {
  expect_arity(OpKind::softmax_xent_smoothed, in, 2, 2);
  expect_labels_for(OpKind::softmax_xent_smoothed, *in[0], *in[1]);
  const double eps = std::get<LabelSmoothingAttrs>(attrs).eps;
  if (!(eps >= 0.0 && eps <= 1.0)) fail(OpKind::softmax_xent_smoothed, "label smoothing eps must be in [0, 1]");
  return {{{1}, DType::f32}};
}

std::vector<OutputSpec> infer_backward(const Inputs& in, const OpAttrs& attrs) {
  expect_arity(OpKind::softmax_xent_smoothed_backward, in, 2, 2);
  expect_labels_for(OpKind::softmax_xent_smoothed_backward, *in[0], *in[1]);
  expect_gradient_scale(OpKind::softmax_xent_smoothed_backward, std::get<LabelSmoothingAttrs>(attrs).gradient_scale);
  return {{in[0]->shape, in[0]->dtype}};
}

void loss_gradient(const GradientContext& c) {
  if (!c.needs_grad(0)) return;
  c.contribute(0, c.emit(OpKind::softmax_xent_smoothed_backward, {c.input(0), c.input(1)}, c.node().attrs,
                         c.input(0))
                      .front());
}

template <typename T>
void loss_cpu(const CpuCall<T>& c) {
  const auto eps = static_cast<T>(c.node.template attr<LabelSmoothingAttrs>().eps);
  c.out[0].real[0] = ref::softmax_xent_smoothed(c.in[0].real, c.in[1].i32, c.in[0].rows, c.in[0].cols, eps);
}
template <typename T>
void backward_cpu(const CpuCall<T>& c) {
  const auto eps = static_cast<T>(c.node.template attr<LabelSmoothingAttrs>().eps);
  ref::softmax_xent_smoothed_backward(c.in[0].real, c.in[1].i32, c.in[0].rows, c.in[0].cols, eps, c.out[0].real);
  scale_loss_gradient(c.out[0], c.node.template attr<LabelSmoothingAttrs>().gradient_scale);
}

}  // namespace

const OpDef& softmax_xent_smoothed_def() {
  static const OpDef def = with_attrs<LabelSmoothingAttrs>(
      {.kind = OpKind::softmax_xent_smoothed, .name = "softmax_xent_smoothed", .infer = &infer_loss,
       .loss_gradient = &loss_gradient, .cpu_f32 = &loss_cpu<float>, .cpu_f64 = &loss_cpu<double>});
  return def;
}

const OpDef& softmax_xent_smoothed_backward_def() {
  static const OpDef def = with_attrs<LabelSmoothingAttrs>(
      {.kind = OpKind::softmax_xent_smoothed_backward, .name = "softmax_xent_smoothed_backward",
       .infer = &infer_backward, .cpu_f32 = &backward_cpu<float>, .cpu_f64 = &backward_cpu<double>});
  return def;
}

}  // namespace sg::ops
