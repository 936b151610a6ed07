// softmax_xent: (logits [B,C], labels i32[B]) -> mean cross-entropy f32[1],
// a loss (seeds the backward pass); softmax_xent_backward: (logits, labels)
// -> dlogits = (softmax - onehot) / B, its gradient for dLoss = 1, times the
// node's LossGradientAttrs::scale (1/N in a data-parallel rank of N).
#include "graph/ops/op_common.hpp"

namespace sg::ops {
namespace {

std::vector<OutputSpec> infer_loss(const Inputs& in, const OpAttrs&) {
  expect_arity(OpKind::softmax_xent, in, 2, 2);
  expect_labels_for(OpKind::softmax_xent, *in[0], *in[1]);
  return {{{1}, DType::f32}};
}

std::vector<OutputSpec> infer_backward(const Inputs& in, const OpAttrs& attrs) {
  expect_arity(OpKind::softmax_xent_backward, in, 2, 2);
  expect_labels_for(OpKind::softmax_xent_backward, *in[0], *in[1]);
  expect_gradient_scale(OpKind::softmax_xent_backward, std::get<LossGradientAttrs>(attrs).scale);
  return {{in[0]->shape, in[0]->dtype}};
}

void loss_gradient(const GradientContext& c) {
  if (!c.needs_grad(0)) return;
  const LossGradientAttrs mean_loss{};  // (a data-parallel rank's scale: the optimizer pass sets it)
  c.contribute(0, c.emit(OpKind::softmax_xent_backward, {c.input(0), c.input(1)}, mean_loss, c.input(0)).front());
}

template <typename T>
void loss_cpu(const CpuCall<T>& c) {
  c.out[0].real[0] = ref::softmax_xent(c.in[0].real, c.in[1].i32, c.in[0].rows, c.in[0].cols);
}
template <typename T>
void backward_cpu(const CpuCall<T>& c) {
  ref::softmax_xent_backward(c.in[0].real, c.in[1].i32, c.in[0].rows, c.in[0].cols, c.out[0].real);
  scale_loss_gradient(c.out[0], c.node.template attr<LossGradientAttrs>().scale);
}

}  // namespace

const OpDef& softmax_xent_def() {
  static const OpDef def = with_attrs<NoAttrs>({.kind = OpKind::softmax_xent, .name = "softmax_xent",
                                                .infer = &infer_loss, .loss_gradient = &loss_gradient,
                                                .cpu_f32 = &loss_cpu<float>, .cpu_f64 = &loss_cpu<double>});
  return def;
}

const OpDef& softmax_xent_backward_def() {
  static const OpDef def = with_attrs<LossGradientAttrs>({.kind = OpKind::softmax_xent_backward,
                                                .name = "softmax_xent_backward", .infer = &infer_backward,
                                                .cpu_f32 = &backward_cpu<float>, .cpu_f64 = &backward_cpu<double>});
  return def;
}

}  // namespace sg::ops
