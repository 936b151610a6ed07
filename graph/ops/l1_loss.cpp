// l1_loss: (pred [B,K], target [B,K]) -> mean over all B*K elements of
// |pred - target|, f32[1] (PyTorch L1Loss()), a loss; l1_loss_backward:
// (pred, target) -> sign(pred - target) / (B K) (sign(0) = 0, as PyTorch).
// The target is float (f32 regression targets) of pred's shape; its dtype
// may differ from pred's (f16 activations on the GPU).
#include "graph/ops/op_common.hpp"

namespace sg::ops {
namespace {

void expect_target(OpKind op, const Inputs& in) {
  expect_arity(op, in, 2, 2);
  expect_floating(op, *in[0]);
  expect_floating(op, *in[1]);
  if (in[0]->shape != in[1]->shape)
    fail(op, "prediction " + describe(*in[0]) + " and target " + describe(*in[1]) + " differ in shape");
}

std::vector<OutputSpec> infer_loss(const Inputs& in, const OpAttrs&) {
  expect_target(OpKind::l1_loss, in);
  return {{{1}, DType::f32}};
}

std::vector<OutputSpec> infer_backward(const Inputs& in, const OpAttrs&) {
  expect_target(OpKind::l1_loss_backward, in);
  return {{in[0]->shape, in[0]->dtype}};
}

void loss_gradient(const GradientContext& c) {
  if (!c.needs_grad(0)) return;
  c.contribute(0, c.emit(OpKind::l1_loss_backward, {c.input(0), c.input(1)}, NoAttrs{}, c.input(0)).front());
}

template <typename T>
void loss_cpu(const CpuCall<T>& c) {
  c.out[0].real[0] = ref::l1_loss(c.in[0].real, c.in[1].real, c.in[0].size);
}
template <typename T>
void backward_cpu(const CpuCall<T>& c) {
  ref::l1_loss_backward(c.in[0].real, c.in[1].real, c.in[0].size, c.out[0].real);
}

}  // namespace

const OpDef& l1_loss_def() {
  static const OpDef def = with_attrs<NoAttrs>({.kind = OpKind::l1_loss, .name = "l1_loss", .infer = &infer_loss,
                                                .loss_gradient = &loss_gradient, .cpu_f32 = &loss_cpu<float>,
                                                .cpu_f64 = &loss_cpu<double>});
  return def;
}

const OpDef& l1_loss_backward_def() {
  static const OpDef def = with_attrs<NoAttrs>({.kind = OpKind::l1_loss_backward, .name = "l1_loss_backward",
                                                .infer = &infer_backward, .cpu_f32 = &backward_cpu<float>,
                                                .cpu_f64 = &backward_cpu<double>});
  return def;
}

}  // namespace sg::ops
