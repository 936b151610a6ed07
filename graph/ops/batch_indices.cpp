// batch_indices: (perm i32[N], step i32[1]) -> idx i32[B], the epoch-local
// batch `step` of the permutation (with ranks > 1: this rank's slice of the
// global batch, issue 25).
#include <fmt/format.h>

#include "graph/ops/op_common.hpp"

namespace sg::ops {
namespace {

constexpr OpKind kOp = OpKind::batch_indices;

std::vector<OutputSpec> infer(const Inputs& in, const OpAttrs& attrs) {
  const auto& a = std::get<BatchIndicesAttrs>(attrs);
  expect_arity(kOp, in, 2, 2);
  expect_rank(kOp, *in[0], 1);
  if (in[0]->dtype != DType::i32 || in[1]->dtype != DType::i32) fail(kOp, "perm and step must be i32");
  if (in[1]->shape != Shape{1}) fail(kOp, fmt::format("step {} must have shape [1]", describe(*in[1])));
  if (a.batch <= 0 || a.batch > in[0]->shape[0])
    fail(kOp, fmt::format("batch {} must be in 1..{} (rows of {})", a.batch, in[0]->shape[0], describe(*in[0])));
  if (a.ranks < 1 || a.rank < 0 || a.rank >= a.ranks)
    fail(kOp, fmt::format("rank {} of {} ranks is out of range", a.rank, a.ranks));
  if (a.batch * a.ranks > in[0]->shape[0])
    fail(kOp, fmt::format("the global batch {} x {} ranks exceeds the rows of {}", a.batch, a.ranks, describe(*in[0])));
  return {{{a.batch}, DType::i32}};
}

template <typename T>
void cpu(const CpuCall<T>& c) {
  const auto& a = c.node.template attr<BatchIndicesAttrs>();
  ref::batch_indices(c.in[0].i32, c.in[0].size, c.in[1].i32[0], a.batch, c.out[0].i32, a.rank, a.ranks);
}

}  // namespace

const OpDef& batch_indices_def() {
  static const OpDef def = with_attrs<BatchIndicesAttrs>(
      {.kind = kOp, .name = "batch_indices", .infer = &infer, .cpu_f32 = &cpu<float>, .cpu_f64 = &cpu<double>});
  return def;
}

}  // namespace sg::ops
