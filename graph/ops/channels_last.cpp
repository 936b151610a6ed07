// to_channels_last: X [N,C,H,W] -> [N,H,W,C], the same values with the
// channels innermost; to_channels_first: the inverse. Each is the other's
// gradient. graph/channels_last_pass.hpp puts them where a channels-last
// region of a network begins and ends. With C = 1 (or H = W = 1) the order
// of the elements does not change: a backend may alias them.
#include <fmt/format.h>

#include "graph/ops/op_common.hpp"
#include "ops/cpu/layout_reference.hpp"

namespace sg::ops {
namespace {

std::vector<OutputSpec> infer(OpKind op, const Inputs& in, bool to_last) {
  expect_arity(op, in, 1, 1);
  const Value& x = *in[0];
  expect_rank(op, x, 4);
  expect_floating(op, x);
  const Shape& s = x.shape;
  return {{to_last ? Shape{s[0], s[2], s[3], s[1]} : Shape{s[0], s[3], s[1], s[2]}, x.dtype}};
}

std::vector<OutputSpec> infer_last(const Inputs& in, const OpAttrs&) {
  return infer(OpKind::to_channels_last, in, true);
}
std::vector<OutputSpec> infer_first(const Inputs& in, const OpAttrs&) {
  return infer(OpKind::to_channels_first, in, false);
}

void gradient_last(const GradientContext& c) {
  if (c.needs_grad(0))
    c.contribute(0, c.emit(OpKind::to_channels_first, {*c.output_grad(0)}, NoAttrs{}, c.input(0)).front());
}
void gradient_first(const GradientContext& c) {
  if (c.needs_grad(0))
    c.contribute(0, c.emit(OpKind::to_channels_last, {*c.output_grad(0)}, NoAttrs{}, c.input(0)).front());
}

template <typename T>
void last_cpu(const CpuCall<T>& c) {  // x [N,C,H,W]
  const auto& s = c.in[0].shape;
  ref::to_channels_last(c.in[0].real, s[0], s[1], s[2] * s[3], c.out[0].real);
}
template <typename T>
void first_cpu(const CpuCall<T>& c) {  // x [N,H,W,C]
  const auto& s = c.in[0].shape;
  ref::to_channels_first(c.in[0].real, s[0], s[3], s[1] * s[2], c.out[0].real);
}

}  // namespace

const OpDef& to_channels_last_def() {
  static const OpDef def = with_attrs<NoAttrs>({.kind = OpKind::to_channels_last,
                                                .name = "to_channels_last",
                                                .infer = &infer_last,
                                                .gradient = &gradient_last,
                                                .cpu_f32 = &last_cpu<float>,
                                                .cpu_f64 = &last_cpu<double>});
  return def;
}

const OpDef& to_channels_first_def() {
  static const OpDef def = with_attrs<NoAttrs>({.kind = OpKind::to_channels_first,
                                                .name = "to_channels_first",
                                                .infer = &infer_first,
                                                .gradient = &gradient_first,
                                                .cpu_f32 = &first_cpu<float>,
                                                .cpu_f64 = &first_cpu<double>});
  return def;
}

}  // namespace sg::ops
