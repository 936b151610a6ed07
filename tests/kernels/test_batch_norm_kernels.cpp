// Issue 37's batch normalisation kernels on the GPU against the CPU reference
// backend (TwinRun, outputs poisoned first): the training normalisation, its
// backward (dx, dgamma, dbeta), the running-statistics update in place (f32
// state) and inference, on [N, C] and [N, C, H, W] values from 2 to 100k
// values per channel, in f32, f16 and bf16. The per-channel block sums add
// in another order than the reference: relative errors by norm, a few
// roundings of each type; the same bits again on a second run.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tests/kernels/twin_run.hpp"
#include "tests/runtime/test_support.hpp"

using namespace sg;
using sg::test::Fill;
using sg::test::TwinRun;

TEST_CASE("batch_norm's four ops follow the CPU reference on [N, C] and [N, C, H, W] values") {
  auto rng = sg::test::fresh_rng();
  const std::vector<Shape> shapes = {{2, 3}, {64, 40}, {3, 5, 4, 4}, {32, 16, 14, 14}, {128, 4, 28, 28}};
  for (const Shape& shape : shapes)
    for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
      CAPTURE(sg::test::last_seed());
      CAPTURE(fmt::format("{} x {}", dtype_name(dtype), fmt::join(shape, "x")));
      const Shape channels{shape[1]};
      Graph g;
      const ValueId x = g.input("x", shape, dtype);
      const ValueId dy = g.input("dy", shape, dtype);
      const ValueId gamma = g.input("gamma", channels, dtype);
      const ValueId beta = g.input("beta", channels, dtype);
      const ValueId mean = g.state("running_mean", channels, DType::f32);
      const ValueId var = g.state("running_var", channels, DType::f32);
      const BatchNormAttrs attrs{1e-5, 0.1};
      const ValueId inferred = g.append_node(OpKind::batch_norm_inference, {x, gamma, beta, mean, var}, attrs).front();
      const ValueId y = g.append_node(OpKind::batch_norm, {x, gamma, beta}, attrs).front();
      const auto grads = g.append_node(OpKind::batch_norm_backward, {dy, x, gamma}, attrs);
      g.append_node(OpKind::batch_norm_stats_update, {x, mean, var}, attrs);
      g.mark_output(inferred);
      g.mark_output(y);
      for (ValueId v : grads) g.mark_output(v);
      // U(0.5, 1.5) for every value: running variances > 0.
      TwinRun run(std::move(g), rng, Fill{false, 0.5, 1.5});
      CHECK(run.lowerings() == std::vector<std::string>(4, "batch_norm"));
      for (ValueId v : {inferred, y, grads[0], grads[1], grads[2], mean, var}) {
        CAPTURE(run.graph().value(v).name);
        CHECK(run.error(v) <= sg::test::sum_order_tolerance(dtype));
      }
      const auto first = run.gpu(grads[1]);
      run.rerun();
      CHECK(run.gpu(grads[1]) == first);
    }
}
