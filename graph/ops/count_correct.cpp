// count_correct: (logits [B,C], labels i32[B]) -> i32[1], the rows whose
// first maximal logit sits at the label.
#include "graph/ops/op_common.hpp"

namespace sg::ops {
namespace {

constexpr OpKind kOp = OpKind::count_correct;

std::vector<OutputSpec> infer(const Inputs& in, const OpAttrs&) {
  expect_arity(kOp, in, 2, 2);
  expect_labels_for(kOp, *in[0], *in[1]);
  return {{{1}, DType::i32}};
}

template <typename T>
void cpu(const CpuCall<T>& c) {
  c.out[0].i32[0] = ref::count_correct(c.in[0].real, c.in[1].i32, c.in[0].rows, c.in[0].cols);
}

}  // namespace

const OpDef& count_correct_def() {
  static const OpDef def = with_attrs<NoAttrs>(
      {.kind = kOp, .name = "count_correct", .infer = &infer, .cpu_f32 = &cpu<float>, .cpu_f64 = &cpu<double>});
  return def;
}

}  // namespace sg::ops
