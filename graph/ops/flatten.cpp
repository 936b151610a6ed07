// flatten: X [N, ...] -> [N, prod(...)]; reshape: X -> the same elements in
// ReshapeAttrs::shape. Both keep the row-major element order, so they are
// views; the CPU reference copies (simple and always correct; a backend may
// alias). flatten's gradient reshapes dY back to X's shape, reshape's
// reshapes back to its input's.
#include <algorithm>

#include <fmt/format.h>

#include "graph/ops/op_common.hpp"

namespace sg::ops {
namespace {

std::vector<OutputSpec> infer_flatten(const Inputs& in, const OpAttrs&) {
  constexpr OpKind op = OpKind::flatten;
  expect_arity(op, in, 1, 1);
  const Value& x = *in[0];
  expect_floating(op, x);
  if (x.shape.size() < 2) fail(op, fmt::format("{} must have rank >= 2 ([N, ...])", describe(x)));
  return {{{x.shape[0], element_count(x.shape) / std::max<std::int64_t>(x.shape[0], 1)}, x.dtype}};
}

std::vector<OutputSpec> infer_reshape(const Inputs& in, const OpAttrs& attrs) {
  constexpr OpKind op = OpKind::reshape;
  expect_arity(op, in, 1, 1);
  const Value& x = *in[0];
  expect_floating(op, x);
  const Shape& to = std::get<ReshapeAttrs>(attrs).shape;
  for (std::int64_t d : to)
    if (d < 0) fail(op, fmt::format("target shape {} has a negative extent", shape_string(to)));
  if (element_count(to) != element_count(x.shape))
    fail(op, fmt::format("cannot reshape {} to {}: element counts differ", describe(x), shape_string(to)));
  return {{to, x.dtype}};
}

// Both: dY reshaped to the input's shape.
void gradient(const GradientContext& c) {
  if (!c.needs_grad(0)) return;
  const ReshapeAttrs back{c.graph().value(c.input(0)).shape};
  c.contribute(0, c.emit(OpKind::reshape, {*c.output_grad(0)}, back, c.input(0)).front());
}

template <typename T>
void copy_cpu(const CpuCall<T>& c) {
  std::copy(c.in[0].real, c.in[0].real + c.in[0].size, c.out[0].real);
}

}  // namespace

const OpDef& flatten_def() {
  static const OpDef def = with_attrs<NoAttrs>({.kind = OpKind::flatten, .name = "flatten", .infer = &infer_flatten,
                                                .gradient = &gradient, .cpu_f32 = &copy_cpu<float>,
                                                .cpu_f64 = &copy_cpu<double>});
  return def;
}

const OpDef& reshape_def() {
  static const OpDef def = with_attrs<ReshapeAttrs>({.kind = OpKind::reshape, .name = "reshape",
                                                     .infer = &infer_reshape, .gradient = &gradient,
                                                     .cpu_f32 = &copy_cpu<float>, .cpu_f64 = &copy_cpu<double>});
  return def;
}

}  // namespace sg::ops
