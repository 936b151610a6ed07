// add: (X, Y) -> X + Y (also how autodiff sums gradient contributions).
#include "graph/ops/op_common.hpp"

namespace sg::ops {
namespace {

constexpr OpKind kOp = OpKind::add;

std::vector<OutputSpec> infer(const Inputs& in, const OpAttrs&) { return infer_binary_same(kOp, in); }

void gradient(const GradientContext& c) {
  const ValueId dy = *c.output_grad(0);
  if (c.needs_grad(0)) c.contribute(0, dy);
  if (c.needs_grad(1)) c.contribute(1, dy);
}

template <typename T>
void cpu(const CpuCall<T>& c) {
  ref::add(c.in[0].real, c.in[1].real, c.in[0].size, c.out[0].real);
}

}  // namespace

const OpDef& add_def() {
  static const OpDef def = with_attrs<NoAttrs>({.kind = kOp, .name = "add", .infer = &infer, .gradient = &gradient,
                                                .cpu_f32 = &cpu<float>, .cpu_f64 = &cpu<double>});
  return def;
}

}  // namespace sg::ops
