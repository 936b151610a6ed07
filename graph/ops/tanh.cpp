// tanh: X -> tanh(X); tanh_backward: (dY, Y) -> dY * (1 - Y^2), reading the
// forward OUTPUT Y.
#include "graph/ops/op_common.hpp"

namespace sg::ops {
namespace {

std::vector<OutputSpec> infer_forward(const Inputs& in, const OpAttrs&) { return infer_unary_same(OpKind::tanh, in); }
std::vector<OutputSpec> infer_backward(const Inputs& in, const OpAttrs&) {
  return infer_binary_same(OpKind::tanh_backward, in);
}

void gradient(const GradientContext& c) {
  if (!c.needs_grad(0)) return;
  c.contribute(0, c.emit(OpKind::tanh_backward, {*c.output_grad(0), c.output(0)}, NoAttrs{}, c.input(0)).front());
}

template <typename T>
void forward_cpu(const CpuCall<T>& c) {
  ref::tanh(c.in[0].real, c.in[0].size, c.out[0].real);
}
template <typename T>
void backward_cpu(const CpuCall<T>& c) {
  ref::tanh_backward(c.in[0].real, c.in[1].real, c.in[0].size, c.out[0].real);
}

}  // namespace

const OpDef& tanh_def() {
  static const OpDef def = with_attrs<NoAttrs>({.kind = OpKind::tanh, .name = "tanh", .infer = &infer_forward,
                                                .gradient = &gradient, .cpu_f32 = &forward_cpu<float>,
                                                .cpu_f64 = &forward_cpu<double>});
  return def;
}

const OpDef& tanh_backward_def() {
  static const OpDef def = with_attrs<NoAttrs>({.kind = OpKind::tanh_backward, .name = "tanh_backward",
                                                .infer = &infer_backward, .cpu_f32 = &backward_cpu<float>,
                                                .cpu_f64 = &backward_cpu<double>});
  return def;
}

}  // namespace sg::ops
