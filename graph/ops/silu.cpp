// silu: X -> X * sigmoid(X); silu_backward: (dY, X) -> dY * silu'(X), reading
// the forward INPUT X.
#include "graph/ops/op_common.hpp"

namespace sg::ops {
namespace {

std::vector<OutputSpec> infer_forward(const Inputs& in, const OpAttrs&) { return infer_unary_same(OpKind::silu, in); }
std::vector<OutputSpec> infer_backward(const Inputs& in, const OpAttrs&) {
  return infer_binary_same(OpKind::silu_backward, in);
}

void gradient(const GradientContext& c) {
  if (!c.needs_grad(0)) return;
  c.contribute(0, c.emit(OpKind::silu_backward, {*c.output_grad(0), c.input(0)}, NoAttrs{}, c.input(0)).front());
}

template <typename T>
void forward_cpu(const CpuCall<T>& c) {
  ref::silu(c.in[0].real, c.in[0].size, c.out[0].real);
}
template <typename T>
void backward_cpu(const CpuCall<T>& c) {
  ref::silu_backward(c.in[0].real, c.in[1].real, c.in[0].size, c.out[0].real);
}

}  // namespace

const OpDef& silu_def() {
  static const OpDef def = with_attrs<NoAttrs>({.kind = OpKind::silu, .name = "silu", .infer = &infer_forward,
                                                .gradient = &gradient, .cpu_f32 = &forward_cpu<float>,
                                                .cpu_f64 = &forward_cpu<double>});
  return def;
}

const OpDef& silu_backward_def() {
  static const OpDef def = with_attrs<NoAttrs>({.kind = OpKind::silu_backward, .name = "silu_backward",
                                                .infer = &infer_backward, .cpu_f32 = &backward_cpu<float>,
                                                .cpu_f64 = &backward_cpu<double>});
  return def;
}

}  // namespace sg::ops
