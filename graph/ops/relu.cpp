// relu: X -> max(X, 0); relu_backward: (dY, Y) -> dY * (Y > 0), masked by the
// forward OUTPUT Y (what the fused cuBLASLt epilogues keep).
#include "graph/ops/op_common.hpp"

namespace sg::ops {
namespace {

std::vector<OutputSpec> infer_relu(const Inputs& in, const OpAttrs&) { return infer_unary_same(OpKind::relu, in); }
std::vector<OutputSpec> infer_relu_backward(const Inputs& in, const OpAttrs&) {
  return infer_binary_same(OpKind::relu_backward, in);
}

void relu_gradient(const GradientContext& c) {
  if (!c.needs_grad(0)) return;
  c.contribute(0, c.emit(OpKind::relu_backward, {*c.output_grad(0), c.output(0)}, NoAttrs{}, c.input(0)).front());
}

template <typename T>
void relu_cpu(const CpuCall<T>& c) {
  ref::relu(c.in[0].real, c.in[0].size, c.out[0].real);
}
template <typename T>
void relu_backward_cpu(const CpuCall<T>& c) {
  ref::relu_backward(c.in[0].real, c.in[1].real, c.in[0].size, c.out[0].real);
}

}  // namespace

const OpDef& relu_def() {
  static const OpDef def = with_attrs<NoAttrs>({.kind = OpKind::relu, .name = "relu", .infer = &infer_relu,
                                                .gradient = &relu_gradient, .cpu_f32 = &relu_cpu<float>,
                                                .cpu_f64 = &relu_cpu<double>});
  return def;
}

const OpDef& relu_backward_def() {
  static const OpDef def = with_attrs<NoAttrs>({.kind = OpKind::relu_backward, .name = "relu_backward",
                                                .infer = &infer_relu_backward, .cpu_f32 = &relu_backward_cpu<float>,
                                                .cpu_f64 = &relu_backward_cpu<double>});
  return def;
}

}  // namespace sg::ops
