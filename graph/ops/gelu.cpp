// gelu: X -> X * Phi(X) = X * 0.5 * (1 + erf(X / sqrt(2))) (exact, not the
// tanh approximation); gelu_backward: (dY, X) -> dY * gelu'(X), reading the
// forward INPUT X.
#include "graph/ops/op_common.hpp"

namespace sg::ops {
namespace {

std::vector<OutputSpec> infer_gelu(const Inputs& in, const OpAttrs&) { return infer_unary_same(OpKind::gelu, in); }
std::vector<OutputSpec> infer_gelu_backward(const Inputs& in, const OpAttrs&) {
  return infer_binary_same(OpKind::gelu_backward, in);
}

void gelu_gradient(const GradientContext& c) {
  if (!c.needs_grad(0)) return;
  c.contribute(0, c.emit(OpKind::gelu_backward, {*c.output_grad(0), c.input(0)}, NoAttrs{}, c.input(0)).front());
}

template <typename T>
void gelu_cpu(const CpuCall<T>& c) {
  ref::gelu(c.in[0].real, c.in[0].size, c.out[0].real);
}
template <typename T>
void gelu_backward_cpu(const CpuCall<T>& c) {
  ref::gelu_backward(c.in[0].real, c.in[1].real, c.in[0].size, c.out[0].real);
}

}  // namespace

const OpDef& gelu_def() {
  static const OpDef def = with_attrs<NoAttrs>({.kind = OpKind::gelu, .name = "gelu", .infer = &infer_gelu,
                                                .gradient = &gelu_gradient, .cpu_f32 = &gelu_cpu<float>,
                                                .cpu_f64 = &gelu_cpu<double>});
  return def;
}

const OpDef& gelu_backward_def() {
  static const OpDef def = with_attrs<NoAttrs>({.kind = OpKind::gelu_backward, .name = "gelu_backward",
                                                .infer = &infer_gelu_backward, .cpu_f32 = &gelu_backward_cpu<float>,
                                                .cpu_f64 = &gelu_backward_cpu<double>});
  return def;
}

}  // namespace sg::ops
