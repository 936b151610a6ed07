// concat (issue 37): inputs [N, C_i, ...] of one dtype whose other
// dimensions agree, joined along dimension 1 (channels of an image, features
// of a vector) in their order: torch.cat(xs, dim=1).
// slice_channels: X [N, C, ...] -> channels [begin, begin + count), the
// gradient concat sends each input.
#include <fmt/format.h>

#include <algorithm>
#include <span>

#include "graph/ops/op_common.hpp"

namespace sg::ops {
namespace {

std::vector<OutputSpec> infer_concat(const Inputs& in, const OpAttrs&) {
  constexpr OpKind op = OpKind::concat;
  expect_arity(op, in, 2, 1024);
  const Value& first = *in[0];
  expect_floating(op, first);
  if (first.shape.size() < 2) fail(op, fmt::format("{} must have rank >= 2 ([N, C, ...])", describe(first)));
  Shape out = first.shape;
  out[1] = 0;
  for (const Value* v : in) {
    expect_same_dtype(op, first, *v);
    Shape other = v->shape, expected = first.shape;
    if (other.size() == expected.size()) other[1] = expected[1] = 0;
    if (other != expected)
      fail(op, fmt::format("{} and {} differ beyond dimension 1", describe(first), describe(*v)));
    out[1] += v->shape[1];
  }
  return {{out, first.dtype}};
}

// Each input's gradient: its channels of dY.
void concat_gradient(const GradientContext& c) {
  std::int64_t begin = 0;
  for (int slot = 0; slot < static_cast<int>(c.node().inputs.size()); ++slot) {
    const std::int64_t count = c.graph().value(c.input(slot)).shape[1];
    if (c.needs_grad(slot))
      c.contribute(slot, c.emit(OpKind::slice_channels, {*c.output_grad(0)}, SliceAttrs{begin, count}, c.input(slot))
                             .front());
    begin += count;
  }
}

std::vector<OutputSpec> infer_slice(const Inputs& in, const OpAttrs& attrs) {
  constexpr OpKind op = OpKind::slice_channels;
  expect_arity(op, in, 1, 1);
  const Value& x = *in[0];
  expect_floating(op, x);
  if (x.shape.size() < 2) fail(op, fmt::format("{} must have rank >= 2 ([N, C, ...])", describe(x)));
  const auto& a = std::get<SliceAttrs>(attrs);
  if (a.begin < 0 || a.count < 1 || a.begin + a.count > x.shape[1])
    fail(op, fmt::format("channels {}..{} are not inside the {} of {}", a.begin, a.begin + a.count - 1, x.shape[1],
                         describe(x)));
  Shape out = x.shape;
  out[1] = a.count;
  return {{out, x.dtype}};
}

// X [N, C, ...] as N rows of C blocks of `inner` values.
std::int64_t inner_of(std::span<const std::int64_t> s) { return elements_from(s, 2); }

template <typename T>
void concat_cpu(const CpuCall<T>& c) {
  const auto& out = c.out[0].shape;
  const std::int64_t inner = inner_of(out), row = out[1] * inner;
  std::int64_t offset = 0;
  for (const auto& x : c.in) {
    const std::int64_t width = x.shape[1] * inner;
    for (std::int64_t n = 0; n < out[0]; ++n)
      std::copy(x.real + n * width, x.real + (n + 1) * width, c.out[0].real + n * row + offset);
    offset += width;
  }
}

template <typename T>
void slice_cpu(const CpuCall<T>& c) {
  const auto& a = c.node.template attr<SliceAttrs>();
  const auto& in = c.in[0].shape;
  const std::int64_t inner = inner_of(in), row = in[1] * inner, width = a.count * inner;
  for (std::int64_t n = 0; n < in[0]; ++n) {
    const T* from = c.in[0].real + n * row + a.begin * inner;
    std::copy(from, from + width, c.out[0].real + n * width);
  }
}

}  // namespace

const OpDef& concat_def() {
  static const OpDef def =
      with_attrs<NoAttrs>({.kind = OpKind::concat, .name = "concat", .infer = &infer_concat,
                           .gradient = &concat_gradient, .cpu_f32 = &concat_cpu<float>, .cpu_f64 = &concat_cpu<double>});
  return def;
}

const OpDef& slice_channels_def() {
  static const OpDef def = with_attrs<SliceAttrs>({.kind = OpKind::slice_channels, .name = "slice_channels",
                                                   .infer = &infer_slice, .cpu_f32 = &slice_cpu<float>,
                                                   .cpu_f64 = &slice_cpu<double>});
  return def;
}

}  // namespace sg::ops
