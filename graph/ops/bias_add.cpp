// bias_add: (X [M,N], b [N]) -> X + b (b added to every row).
#include <fmt/format.h>

#include "graph/ops/op_common.hpp"

namespace sg::ops {

std::vector<OutputSpec> infer_bias_add(OpKind op, const Inputs& in) {
  expect_arity(op, in, 2, 2);
  expect_rank(op, *in[0], 2);
  expect_rank(op, *in[1], 1);
  expect_floating(op, *in[0]);
  expect_same_dtype(op, *in[0], *in[1]);
  if (in[1]->shape[0] != in[0]->shape[1])
    fail(op, fmt::format("bias {} does not match columns of {}", describe(*in[1]), describe(*in[0])));
  return {{in[0]->shape, in[0]->dtype}};
}

namespace {

constexpr OpKind kOp = OpKind::bias_add;

std::vector<OutputSpec> infer(const Inputs& in, const OpAttrs&) { return infer_bias_add(kOp, in); }

// dX = dY, db = column sums of dY.
void gradient(const GradientContext& c) {
  const ValueId dy = *c.output_grad(0);
  if (c.needs_grad(0)) c.contribute(0, dy);
  if (c.needs_grad(1)) c.contribute(1, c.emit(OpKind::reduce_rows, {dy}, NoAttrs{}, c.input(1)).front());
}

template <typename T>
void cpu(const CpuCall<T>& c) {
  ref::bias_add(c.in[0].real, c.in[1].real, c.in[0].rows, c.in[0].cols, c.out[0].real);
}

}  // namespace

const OpDef& bias_add_def() {
  static const OpDef def = with_attrs<NoAttrs>({.kind = kOp, .name = "bias_add", .infer = &infer,
                                                .gradient = &gradient, .cpu_f32 = &cpu<float>,
                                                .cpu_f64 = &cpu<double>});
  return def;
}

}  // namespace sg::ops
