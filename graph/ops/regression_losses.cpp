// The regression losses, one family: (pred [B,K], target [B,K]) -> the mean
// over all B*K elements, f32[1], a loss; and their backward (pred, target) ->
// the gradient for dLoss = 1 times the backward's LossGradientAttrs::scale
// (1/N in a data-parallel rank of N), pred's shape and dtype:
//   mse_loss: (pred - target)^2 (PyTorch MSELoss()); backward 2 (pred - target) / (B K)
//   l1_loss:  |pred - target|   (PyTorch L1Loss());  backward sign(pred - target) / (B K), sign(0) = 0
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

// One loss of the family: its op kinds and CPU references.
struct MseLoss {
  static constexpr OpKind loss = OpKind::mse_loss, backward = OpKind::mse_loss_backward;
  template <typename T>
  static T value(const T* pred, const T* target, std::int64_t n) { return ref::mse_loss(pred, target, n); }
  template <typename T>
  static void gradient(const T* pred, const T* target, std::int64_t n, T* out) {
    ref::mse_loss_backward(pred, target, n, out);
  }
};

struct L1Loss {
  static constexpr OpKind loss = OpKind::l1_loss, backward = OpKind::l1_loss_backward;
  template <typename T>
  static T value(const T* pred, const T* target, std::int64_t n) { return ref::l1_loss(pred, target, n); }
  template <typename T>
  static void gradient(const T* pred, const T* target, std::int64_t n, T* out) {
    ref::l1_loss_backward(pred, target, n, out);
  }
};

template <typename L>
std::vector<OutputSpec> infer_loss(const Inputs& in, const OpAttrs&) {
  expect_target(L::loss, in);
  return {{{1}, DType::f32}};
}

template <typename L>
std::vector<OutputSpec> infer_backward(const Inputs& in, const OpAttrs& attrs) {
  expect_target(L::backward, in);
  expect_gradient_scale(L::backward, std::get<LossGradientAttrs>(attrs).scale);
  return {{in[0]->shape, in[0]->dtype}};
}

template <typename L>
void loss_gradient(const GradientContext& c) {
  if (!c.needs_grad(0)) return;
  c.contribute(0, c.emit(L::backward, {c.input(0), c.input(1)}, LossGradientAttrs{}, c.input(0)).front());
}

template <typename L, typename T>
void loss_cpu(const CpuCall<T>& c) {
  c.out[0].real[0] = L::value(c.in[0].real, c.in[1].real, c.in[0].size);
}

template <typename L, typename T>
void backward_cpu(const CpuCall<T>& c) {
  L::gradient(c.in[0].real, c.in[1].real, c.in[0].size, c.out[0].real);
  scale_loss_gradient(c.out[0], c.node.template attr<LossGradientAttrs>().scale);
}

template <typename L>
OpDef loss_def(std::string_view name) {
  return with_attrs<NoAttrs>({.kind = L::loss, .name = name, .infer = &infer_loss<L>,
                              .loss_gradient = &loss_gradient<L>, .cpu_f32 = &loss_cpu<L, float>,
                              .cpu_f64 = &loss_cpu<L, double>});
}

template <typename L>
OpDef backward_def(std::string_view name) {
  return with_attrs<LossGradientAttrs>({.kind = L::backward, .name = name, .infer = &infer_backward<L>,
                              .cpu_f32 = &backward_cpu<L, float>, .cpu_f64 = &backward_cpu<L, double>});
}

}  // namespace

const OpDef& mse_loss_def() {
  static const OpDef def = loss_def<MseLoss>("mse_loss");
  return def;
}

const OpDef& mse_loss_backward_def() {
  static const OpDef def = backward_def<MseLoss>("mse_loss_backward");
  return def;
}

const OpDef& l1_loss_def() {
  static const OpDef def = loss_def<L1Loss>("l1_loss");
  return def;
}

const OpDef& l1_loss_backward_def() {
  static const OpDef def = backward_def<L1Loss>("l1_loss_backward");
  return def;
}

}  // namespace sg::ops
