// Issue 37's layer_norm kernels on the GPU against the CPU reference backend
// (TwinRun: the CUDA program's real cover vs CpuExecutor<float>, outputs
// poisoned first): the forward and the backward (dx, dgamma, dbeta) on rows
// from 1 value to more than a block's 256 threads hold, few and many rows,
// [features] and [C, H, W] examples, in f32, f16 and bf16. The block sums
// add in another order than the reference, so the checks are relative
// errors by norm, a few roundings of each type.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tests/kernels/twin_run.hpp"
#include "tests/runtime/test_support.hpp"

using namespace sg;
using sg::test::Fill;
using sg::test::pick;
using sg::test::TwinRun;

TEST_CASE("layer_norm and layer_norm_backward follow the CPU reference on rows of 3 to 5000 values") {
  auto rng = sg::test::fresh_rng();
  // (Not rows of 2: their dx is 0 up to eps, all rounding noise to compare.)
  const std::vector<Shape> shapes = {{1, 3}, {7, 5}, {64, 32}, {3, 257}, {200, 64}, {16, 8, 7, 7}, {5, 5000}};
  for (const Shape& shape : shapes)
    for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
      CAPTURE(sg::test::last_seed());
      CAPTURE(fmt::format("{} x {}", dtype_name(dtype), fmt::join(shape, "x")));
      const Shape example(shape.begin() + 1, shape.end());
      Graph g;
      const ValueId x = g.input("x", shape, dtype);
      const ValueId dy = g.input("dy", shape, dtype);
      const ValueId gamma = g.input("gamma", example, dtype);
      const ValueId beta = g.input("beta", example, dtype);
      const LayerNormAttrs attrs{1e-5};
      const ValueId y = g.append_node(OpKind::layer_norm, {x, gamma, beta}, attrs).front();
      const auto grads = g.append_node(OpKind::layer_norm_backward, {dy, x, gamma}, attrs);
      g.mark_output(y);
      for (ValueId v : grads) g.mark_output(v);
      TwinRun run(std::move(g), rng, Fill{false, -2.0, 2.0});
      CHECK(run.lowerings() == std::vector<std::string>{"layer_norm", "layer_norm"});
      CHECK(run.error(y) <= sg::test::sum_order_tolerance(dtype));
      for (ValueId v : grads) {
        CAPTURE(run.graph().value(v).name);
        CHECK(run.error(v) <= sg::test::sum_order_tolerance(dtype));
      }
      // The same bits on a second run (fixed reduction orders, no atomics).
      const auto first = run.gpu(grads[1]);
      run.rerun();
      CHECK(run.gpu(grads[1]) == first);
    }
}
