// augment_images (issue 37): random translation with fill and horizontal
// flip of each training image, drawn per example from Philox (seed, step,
// global example index: ops/augment_draws.hpp), so graph replays, stream
// launches, the CPU backend and resumed runs give the same bits. Only the
// training graph has it (the builder leaves it out of eval and predict); it
// sits right after the batch fetch, on values that need no gradient, so it
// has no gradient rule.
#include <fmt/format.h>

#include "graph/ops/op_common.hpp"
#include "ops/augment_draws.hpp"

namespace sg::ops {
namespace {

std::vector<OutputSpec> infer(const Inputs& in, const OpAttrs& attrs) {
  constexpr OpKind op = OpKind::augment_images;
  expect_arity(op, in, 2, 2);
  const Value &x = *in[0], &step = *in[1];
  expect_rank(op, x, 4);
  expect_floating(op, x);
  if (step.dtype != DType::i32 || element_count(step.shape) != 1)
    fail(op, fmt::format("{} must be the i32[1] step counter", describe(step)));
  const auto& a = std::get<AugmentAttrs>(attrs);
  if (a.translate < 0 || a.translate >= std::min(x.shape[2], x.shape[3]))
    fail(op, fmt::format("translate {} must be in [0, {}) for the {} images", a.translate,
                         std::min(x.shape[2], x.shape[3]), describe(x)));
  if (a.example_offset < 0) fail(op, fmt::format("example_offset {} must be >= 0", a.example_offset));
  return {{x.shape, x.dtype}};
}

template <typename T>
void augment_cpu(const CpuCall<T>& c) {
  const auto& a = c.node.template attr<AugmentAttrs>();
  const auto& s = c.in[0].shape;
  const std::int64_t channels = s[1], h = s[2], w = s[3];
  const std::int32_t step = c.in[1].i32[0];
  const T fill = static_cast<T>(a.fill);
  for (std::int64_t n = 0; n < s[0]; ++n) {
    const augment::Draw d = augment::draw(a.seed, step, a.example_offset + n, a.translate, a.flip);
    for (std::int64_t ch = 0; ch < channels; ++ch) {
      const T* plane = c.in[0].real + (n * channels + ch) * h * w;
      T* out = c.out[0].real + (n * channels + ch) * h * w;
      for (std::int64_t i = 0; i < h; ++i)
        for (std::int64_t j = 0; j < w; ++j) {
          const std::int64_t r = augment::source_row(d, i, h), col = augment::source_col(d, j, w);
          out[i * w + j] = r < 0 || col < 0 ? fill : plane[r * w + col];
        }
    }
  }
}

}  // namespace

const OpDef& augment_images_def() {
  static const OpDef def = with_attrs<AugmentAttrs>({.kind = OpKind::augment_images, .name = "augment_images",
                                                     .infer = &infer, .cpu_f32 = &augment_cpu<float>,
                                                     .cpu_f64 = &augment_cpu<double>});
  return def;
}

}  // namespace sg::ops
