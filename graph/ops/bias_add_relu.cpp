// bias_add_relu: (X [M,N], b [N]) -> (Z = X + b, relu(Z)): two outputs, the
// pre-activation kept next to the activation (what cuBLASLt's aux epilogues
// produce). Its gradient takes both outputs' gradients, either may be absent:
// dZ_total = dZ + relu_backward(dA, A); dX = dZ_total, db = column sums.
#include "graph/ops/op_common.hpp"

namespace sg::ops {
namespace {

constexpr OpKind kOp = OpKind::bias_add_relu;

std::vector<OutputSpec> infer(const Inputs& in, const OpAttrs&) {
  const auto z = infer_bias_add(kOp, in);
  return {z.front(), z.front()};
}

void gradient(const GradientContext& c) {
  const ValueId z = c.output(0);
  std::optional<ValueId> dz = c.output_grad(0);
  if (const auto da = c.output_grad(1)) {
    const ValueId masked = c.emit(OpKind::relu_backward, {*da, c.output(1)}, NoAttrs{}, z).front();
    dz = dz ? c.emit(OpKind::add, {*dz, masked}, NoAttrs{}, z).front() : masked;
  }
  if (c.needs_grad(0)) c.contribute(0, *dz);
  if (c.needs_grad(1)) c.contribute(1, c.emit(OpKind::reduce_rows, {*dz}, NoAttrs{}, c.input(1)).front());
}

template <typename T>
void cpu(const CpuCall<T>& c) {
  ref::bias_add(c.in[0].real, c.in[1].real, c.in[0].rows, c.in[0].cols, c.out[0].real);
  ref::relu(c.out[0].real, c.out[0].size, c.out[1].real);
}

}  // namespace

const OpDef& bias_add_relu_def() {
  static const OpDef def = with_attrs<NoAttrs>({.kind = kOp, .name = "bias_add_relu", .infer = &infer,
                                                .gradient = &gradient, .cpu_f32 = &cpu<float>,
                                                .cpu_f64 = &cpu<double>});
  return def;
}

}  // namespace sg::ops
