// cast: X -> X in CastAttrs::out_dtype (between f32, f16 and bf16).
#include <algorithm>

#include "graph/ops/op_common.hpp"

namespace sg::ops {
namespace {

constexpr OpKind kOp = OpKind::cast;

std::vector<OutputSpec> infer(const Inputs& in, const OpAttrs& attrs) {
  const auto& a = std::get<CastAttrs>(attrs);
  expect_arity(kOp, in, 1, 1);
  expect_floating(kOp, *in[0]);
  if (!is_floating(a.out_dtype)) fail(kOp, "cast target must be f32, f16 or bf16");
  return {{in[0]->shape, a.out_dtype}};
}

// The gradient is cast back to the input's dtype.
void gradient(const GradientContext& c) {
  if (!c.needs_grad(0)) return;
  const DType back = c.graph().value(c.input(0)).dtype;
  c.contribute(0, c.emit(kOp, {*c.output_grad(0)}, CastAttrs{back}, c.input(0)).front());
}

// The CPU backend computes every floating dtype in T: a copy.
template <typename T>
void cpu(const CpuCall<T>& c) {
  std::copy(c.in[0].real, c.in[0].real + c.in[0].size, c.out[0].real);
}

}  // namespace

const OpDef& cast_def() {
  static const OpDef def = with_attrs<CastAttrs>({.kind = kOp, .name = "cast", .infer = &infer,
                                                  .gradient = &gradient, .cpu_f32 = &cpu<float>,
                                                  .cpu_f64 = &cpu<double>});
  return def;
}

}  // namespace sg::ops
