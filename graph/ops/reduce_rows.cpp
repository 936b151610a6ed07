// reduce_rows: X [M,N] -> column sums [N] (bias gradients; backward only).
#include "graph/ops/op_common.hpp"

namespace sg::ops {
namespace {

constexpr OpKind kOp = OpKind::reduce_rows;

std::vector<OutputSpec> infer(const Inputs& in, const OpAttrs&) {
  expect_arity(kOp, in, 1, 1);
  expect_rank(kOp, *in[0], 2);
  expect_floating(kOp, *in[0]);
  return {{{in[0]->shape[1]}, in[0]->dtype}};
}

template <typename T>
void cpu(const CpuCall<T>& c) {
  ref::reduce_rows(c.in[0].real, c.in[0].rows, c.in[0].cols, c.out[0].real);
}

}  // namespace

const OpDef& reduce_rows_def() {
  static const OpDef def = with_attrs<NoAttrs>(
      {.kind = kOp, .name = "reduce_rows", .infer = &infer, .cpu_f32 = &cpu<float>, .cpu_f64 = &cpu<double>});
  return def;
}

}  // namespace sg::ops
