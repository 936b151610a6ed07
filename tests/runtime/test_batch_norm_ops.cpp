// Issue 37's batch normalisation ops on the CPU backend, PyTorch's
// BatchNorm1d / BatchNorm2d semantics: training mode normalises each channel
// by the batch's mean and biased variance over N (and H, W); the running
// statistics move by momentum towards the batch mean and the UNBIASED
// variance; eval mode uses the running statistics. Values worked by hand,
// f64 finite-difference gradients of x, gamma and beta in training mode
// (the backward recomputes the statistics), autodiff's backward node, and
// shape / attribute errors. (The CUDA lowerings and the model layer come
// next: no model builds these ops yet.)
#include <doctest/doctest.h>

#include <cmath>

#include "graph/autodiff.hpp"
#include "runtime/cpu/cpu_executor.hpp"
#include "tests/runtime/finite_differences.hpp"
#include "tests/runtime/test_support.hpp"

using namespace sg;

namespace {

const BatchNormAttrs kAttrs{1e-5, 0.1};

ValueId batch_norm(Graph& g, ValueId x, ValueId gamma, ValueId beta, BatchNormAttrs a = kAttrs) {
  return g.append_node(OpKind::batch_norm, {x, gamma, beta}, a).front();
}

}  // namespace

TEST_CASE("batch_norm training, running-statistics update and inference follow PyTorch's formulas") {
  // [N=2, C=2, H=1, W=2]: channel 0 holds 1, 2, 3, 4 (mean 2.5, biased var 1.25,
  // unbiased 5/3); channel 1 holds 10 four times (var 0).
  Graph g;
  const auto x = g.input("x", {2, 2, 1, 2}, DType::f32);
  const auto gamma = g.input("gamma", {2}, DType::f32);
  const auto beta = g.input("beta", {2}, DType::f32);
  const auto mean = g.state("running_mean", {2}, DType::f32);
  const auto var = g.state("running_var", {2}, DType::f32);
  const BatchNormAttrs a{0.25, 0.1};
  const auto y = batch_norm(g, x, gamma, beta, a);
  g.append_node(OpKind::batch_norm_stats_update, {x, mean, var}, a);
  const auto yi = g.append_node(OpKind::batch_norm_inference, {x, gamma, beta, mean, var}, a).front();
  CpuExecutor<double> exec(g);
  exec.tensor(x).real = {1, 2, 10, 10, 3, 4, 10, 10};
  exec.tensor(gamma).real = {2, 1};
  exec.tensor(beta).real = {0, 5};
  exec.tensor(mean).real = {0, 0};  // PyTorch's start: mean 0, var 1
  exec.tensor(var).real = {1, 1};
  exec.run();
  const double s = 2 / std::sqrt(1.25 + 0.25);  // gamma / sqrt(var + eps)
  CHECK(sg::test::relative_error(exec.tensor(y).real,
                                 std::vector<double>{-1.5 * s, -0.5 * s, 5, 5, 0.5 * s, 1.5 * s, 5, 5}) < 1e-15);
  CHECK(exec.tensor(mean).real[0] == doctest::Approx(0.1 * 2.5));
  CHECK(exec.tensor(mean).real[1] == doctest::Approx(0.1 * 10));
  CHECK(exec.tensor(var).real[0] == doctest::Approx(0.9 + 0.1 * 5.0 / 3.0));  // the unbiased variance
  CHECK(exec.tensor(var).real[1] == doctest::Approx(0.9));
  // Inference ran after the update (graph order): the updated running statistics.
  const double rstd0 = 1 / std::sqrt(0.9 + 0.1 * 5.0 / 3.0 + 0.25), rstd1 = 1 / std::sqrt(0.9 + 0.25);
  CHECK(exec.tensor(yi).real[0] == doctest::Approx((1 - 0.25) * rstd0 * 2));
  CHECK(exec.tensor(yi).real[2] == doctest::Approx((10 - 1.0) * rstd1 * 1 + 5));
}

TEST_CASE("finite differences: batch_norm's x, gamma and beta gradients in training mode, [N, C] and [N, C, H, W]") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  for (const Shape& shape : {Shape{5, 3}, Shape{2, 3, 2, 3}, Shape{1, 2, 3, 3}}) {
    CAPTURE(shape_string(shape));
    Graph g;
    const auto x = g.param("x", shape, DType::f32);
    const auto gamma = g.param("gamma", {shape[1]}, DType::f32);
    const auto beta = g.param("beta", {shape[1]}, DType::f32);
    sg::test::check_gradients_through_mse(g, batch_norm(g, x, gamma, beta, BatchNormAttrs{1e-3, 0.1}), rng, 0);
  }
  // conv -> batch_norm -> relu: the conv's weights through the normalisation
  // (no conv bias: a per-channel constant before batch_norm cancels, its
  // gradient is 0 up to rounding, which leaves nothing to compare).
  Graph g;
  const auto x = g.input("x", {3, 2, 5, 5}, DType::f32);
  const auto w = g.param("w", {4, 2, 3, 3}, DType::f32);
  const auto c = g.append_node(OpKind::conv2d, {x, w}, Conv2dAttrs{1, 1, 0, 0}).front();
  const auto gamma = g.param("gamma", {4}, DType::f32);
  const auto beta = g.param("beta", {4}, DType::f32);
  sg::test::check_gradients_through_mse(g, g.relu(batch_norm(g, c, gamma, beta)), rng, 0);
}

TEST_CASE("autodiff of batch_norm emits one batch_norm_backward reading X and gamma") {
  Graph g;
  const auto x = g.input("x", {4, 3}, DType::f32);
  const auto gamma = g.param("gamma", {3}, DType::f32);
  const auto beta = g.param("beta", {3}, DType::f32);
  const auto y = batch_norm(g, x, gamma, beta);
  const auto loss = g.append_node(OpKind::mse_loss, {y, g.input("t", {4, 3}, DType::f32)}, NoAttrs{}).front();
  const auto grads = append_backward(g, loss);
  CHECK(grads.of_param.size() == 2);
  int backwards = 0;
  for (const Node& n : g.nodes())
    if (n.op == OpKind::batch_norm_backward) {
      ++backwards;
      CHECK(n.inputs == std::vector<ValueId>{n.inputs[0], x, gamma});
      CHECK(n.outputs.size() == 3);
    }
  CHECK(backwards == 1);
  // The running statistics (inputs 1, 2) are updated in place; X is only read.
  g.append_node(OpKind::batch_norm_stats_update, {x, g.state("m", {3}, DType::f32), g.state("v", {3}, DType::f32)},
                kAttrs);
  CHECK(in_place_inputs(g.nodes().back()) == std::vector<int>{1, 2});
}

TEST_CASE("batch_norm's errors name the op and the values") {
  Graph g;
  const auto x = g.input("x", {4, 3, 2, 2}, DType::f32);
  const auto c3 = g.input("c3", {3}, DType::f32);
  const auto c4 = g.input("c4", {4}, DType::f32);
  CHECK_THROWS_WITH_AS(batch_norm(g, x, c4, c3),
                       doctest::Contains("batch_norm: 'c4' [4] f32 must be [3], one value per channel"), GraphError);
  CHECK_THROWS_WITH_AS(batch_norm(g, g.input("v", {4, 3, 2}, DType::f32), c3, c3),
                       doctest::Contains("must be [N, C] or [N, C, H, W]"), GraphError);
  CHECK_THROWS_WITH_AS(batch_norm(g, g.input("one", {1, 3}, DType::f32), c3, c3),
                       doctest::Contains("one value per channel: batch statistics need more than one"), GraphError);
  CHECK_THROWS_WITH_AS(batch_norm(g, x, c3, c3, BatchNormAttrs{0.0, 0.1}), doctest::Contains("eps 0 must be > 0"),
                       GraphError);
  CHECK_THROWS_WITH_AS(batch_norm(g, x, c3, c3, BatchNormAttrs{1e-5, 1.5}),
                       doctest::Contains("momentum 1.5 must be in [0, 1]"), GraphError);
  // Inference needs no batch: one example is fine.
  CHECK_NOTHROW(g.append_node(OpKind::batch_norm_inference, {g.input("e", {1, 3}, DType::f32), c3, c3, c3, c3}, kAttrs));
}
