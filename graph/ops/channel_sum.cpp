// channel_sum: X [N,C,H,W] -> [C], the sum over N, H and W of each channel:
// a convolution's bias gradient. reduce_rows (column sums of [M,N]) does not
// fit NCHW, where a channel's elements are N strided planes.
#include "graph/ops/op_common.hpp"
#include "ops/cpu/conv_reference.hpp"

namespace sg::ops {
namespace {

constexpr OpKind kOp = OpKind::channel_sum;

std::vector<OutputSpec> infer(const Inputs& in, const OpAttrs&) {
  expect_arity(kOp, in, 1, 1);
  expect_rank(kOp, *in[0], 4);
  expect_floating(kOp, *in[0]);
  return {{{in[0]->shape[1]}, in[0]->dtype}};
}

template <typename T>
void cpu(const CpuCall<T>& c) {
  const auto& s = c.in[0].shape;
  ref::channel_sum(c.in[0].real, s[0], s[1], s[2] * s[3], c.out[0].real);
}

}  // namespace

const OpDef& channel_sum_def() {
  static const OpDef def = with_attrs<NoAttrs>(
      {.kind = kOp, .name = "channel_sum", .infer = &infer, .cpu_f32 = &cpu<float>, .cpu_f64 = &cpu<double>});
  return def;
}

}  // namespace sg::ops
