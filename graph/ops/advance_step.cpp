// advance_step: step i32[1] -> nothing; step += 1 in place (the last node of
// a training step).
#include <fmt/format.h>

#include "graph/ops/op_common.hpp"

namespace sg::ops {
namespace {

constexpr OpKind kOp = OpKind::advance_step;

std::vector<OutputSpec> infer(const Inputs& in, const OpAttrs&) {
  expect_arity(kOp, in, 1, 1);
  if (in[0]->dtype != DType::i32 || in[0]->shape != Shape{1})
    fail(kOp, fmt::format("step {} must be i32 [1]", describe(*in[0])));
  return {};
}

std::vector<int> in_place(const OpAttrs&, int) { return {0}; }

template <typename T>
void cpu(const CpuCall<T>& c) {
  c.in[0].i32[0] += 1;
}

}  // namespace

const OpDef& advance_step_def() {
  static const OpDef def = with_attrs<NoAttrs>({.kind = kOp, .name = "advance_step", .infer = &infer,
                                                .in_place = &in_place, .cpu_f32 = &cpu<float>,
                                                .cpu_f64 = &cpu<double>});
  return def;
}

}  // namespace sg::ops
