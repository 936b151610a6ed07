// Issue 37's mean-pooling kernels on the GPU against the CPU reference
// backend (TwinRun: the CUDA program's real cover vs CpuExecutor<float>,
// outputs poisoned first): avg_pool2d and its backward on random shapes,
// kernels and strides (overlapping, exact and gapped windows, elements no
// window covers), global_avg_pool2d and its backward on planes from 1x1 to
// larger than a warp, in f32, f16 and bf16. The window kernels add in the
// reference's order (bit-identical), in NCHW and channels-last; the plane
// mean sums across a warp, so its check is a relative error by norm.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tests/kernels/twin_run.hpp"
#include "tests/runtime/test_support.hpp"

using namespace sg;
using sg::test::Fill;
using sg::test::pick;
using sg::test::TwinRun;

namespace {

const std::vector<DType> kDtypes = {DType::f32, DType::f16, DType::bf16};

// The plane mean's f32 sum runs in another order than the CPU's: a few
// roundings of the result's type apart at most.
double plane_mean_tolerance(DType dtype) { return dtype == DType::f32 ? 1e-6 : dtype == DType::f16 ? 2e-3 : 1.6e-2; }

}  // namespace

TEST_CASE("avg_pool2d and avg_pool2d_backward match the CPU reference bit for bit on random windows, either layout") {
  auto rng = sg::test::fresh_rng();
  for (int trial = 0; trial < 24; ++trial)
    for (const DType dtype : kDtypes) {
      const bool last = trial % 2 == 1;  // [N,H,W,C] values
      const std::int64_t kernel = pick(rng, 1, 4), stride = pick(rng, 1, 4);
      const std::int64_t n = pick(rng, 1, 5), c = pick(rng, 1, 19), h = kernel + pick(rng, 0, 13),
                         w = kernel + pick(rng, 0, 13);
      const std::int64_t oh = (h - kernel) / stride + 1, ow = (w - kernel) / stride + 1;
      const Shape x_shape = last ? Shape{n, h, w, c} : Shape{n, c, h, w};
      const Shape pooled = last ? Shape{n, oh, ow, c} : Shape{n, c, oh, ow};
      CAPTURE(sg::test::last_seed());
      CAPTURE(fmt::format("{} x {} kernel {} stride {}{}", dtype_name(dtype), fmt::join(x_shape, "x"), kernel, stride,
                          last ? " channels-last" : ""));
      Graph g;
      const ValueId x = g.input("x", x_shape, dtype);
      const ValueId dy = g.input("dy", pooled, dtype);
      const ValueId y = g.append_node(OpKind::avg_pool2d, {x}, Pool2dAttrs{kernel, stride, 0, 0, last}).front();
      const ValueId dx =
          g.append_node(OpKind::avg_pool2d_backward, {dy}, Pool2dAttrs{kernel, stride, h, w, last}).front();
      g.mark_output(y);
      g.mark_output(dx);
      TwinRun run(std::move(g), rng, Fill{});
      CHECK(run.lowerings() == std::vector<std::string>{"avg_pool2d", "avg_pool2d"});
      CHECK(run.error(y) == 0.0);
      CHECK(run.error(dx) == 0.0);
    }
}

TEST_CASE("global_avg_pool2d and its backward match the CPU reference on planes of 1 to 1000+ elements") {
  auto rng = sg::test::fresh_rng();
  const std::vector<std::pair<std::int64_t, std::int64_t>> planes = {{1, 1}, {1, 7}, {4, 4}, {7, 5}, {8, 8}, {33, 35}};
  for (const auto& [h, w] : planes)
    for (const DType dtype : kDtypes) {
      const Shape x_shape{pick(rng, 1, 9), pick(rng, 1, 70), h, w};
      CAPTURE(sg::test::last_seed());
      CAPTURE(fmt::format("{} x {}", dtype_name(dtype), fmt::join(x_shape, "x")));
      Graph g;
      const ValueId x = g.input("x", x_shape, dtype);
      const ValueId dy = g.input("dy", {x_shape[0], x_shape[1], 1, 1}, dtype);
      const ValueId y = g.append_node(OpKind::global_avg_pool2d, {x}, NoAttrs{}).front();
      const ValueId dx = g.append_node(OpKind::global_avg_pool2d_backward, {dy}, ReshapeAttrs{x_shape}).front();
      g.mark_output(y);
      g.mark_output(dx);
      // U(0.5, 1.5): a mean far from 0, so the relative error means something.
      TwinRun run(std::move(g), rng, Fill{false, 0.5, 1.5});
      CHECK(run.lowerings() == std::vector<std::string>{"avg_pool2d", "avg_pool2d"});
      CHECK(run.error(y) <= plane_mean_tolerance(dtype));
      CHECK(run.error(dx) == 0.0);
    }
}
