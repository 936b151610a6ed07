// Issue 37's layer_norm on the CPU backend: PyTorch's LayerNorm over each
// example's values (any per-example shape: [features] or [C, H, W]) with an
// affine weight and bias. Values worked by hand and each row's mean 0 /
// variance 1 before the affine; f64 finite-difference gradients of x, gamma
// and beta (the backward recomputes the statistics from x; one value per
// example normalises to 0 whatever it is, so x's gradient there is 0 and
// the helper, which wants every gradient non-zero, is not used on it); which gradients
// autodiff asks for; shape and eps errors.
#include <doctest/doctest.h>

#include <cmath>

#include "graph/autodiff.hpp"
#include "runtime/cpu/cpu_executor.hpp"
#include "tests/runtime/finite_differences.hpp"
#include "tests/runtime/test_support.hpp"

using namespace sg;

namespace {

ValueId layer_norm(Graph& g, ValueId x, ValueId gamma, ValueId beta, double eps = 1e-5) {
  return g.append_node(OpKind::layer_norm, {x, gamma, beta}, LayerNormAttrs{eps}).front();
}

}  // namespace

TEST_CASE("layer_norm normalises each example (biased variance, eps inside the root) then scales and shifts") {
  Graph g;
  const auto x = g.input("x", {2, 4}, DType::f32);
  const auto gamma = g.input("gamma", {4}, DType::f32);
  const auto beta = g.input("beta", {4}, DType::f32);
  const auto y = layer_norm(g, x, gamma, beta, 0.25);
  CpuExecutor<double> exec(g);
  exec.tensor(x).real = {1, 2, 3, 4, 10, 10, 10, 10};
  exec.tensor(gamma).real = {1, 1, 2, 2};
  exec.tensor(beta).real = {0, 0, 0, 1};
  exec.run();
  // Row 0: mean 2.5, variance 1.25, 1/sqrt(1.25 + 0.25) = 1/sqrt(1.5). Row 1: constant -> 0, then beta.
  const double s = 1 / std::sqrt(1.5);
  const std::vector<double> expected = {-1.5 * s, -0.5 * s, 2 * 0.5 * s, 2 * 1.5 * s + 1, 0, 0, 0, 1};
  CHECK(sg::test::relative_error(exec.tensor(y).real, expected) < 1e-15);

  // Unit gamma, zero beta, tiny eps: every example of a [3, 2, 3, 2] value has mean 0 and variance ~1.
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  Graph g2;
  const auto x2 = g2.input("x", {3, 2, 3, 2}, DType::f32);
  const auto y2 = layer_norm(g2, x2, g2.input("gamma", {2, 3, 2}, DType::f32), g2.input("beta", {2, 3, 2}, DType::f32),
                             1e-12);
  CpuExecutor<double> e2(g2);
  sg::test::fill_uniform(e2.tensor(x2).real, rng, -3.0, 5.0);
  e2.tensor(g2.value_named("gamma")).real.assign(12, 1.0);
  e2.tensor(g2.value_named("beta")).real.assign(12, 0.0);
  e2.run();
  for (int row = 0; row < 3; ++row) {
    double sum = 0, squares = 0;
    for (int j = 0; j < 12; ++j) sum += e2.tensor(y2).real[static_cast<std::size_t>(row * 12 + j)];
    for (int j = 0; j < 12; ++j) squares += std::pow(e2.tensor(y2).real[static_cast<std::size_t>(row * 12 + j)], 2);
    CHECK(std::abs(sum / 12) < 1e-12);
    CHECK(squares / 12 == doctest::Approx(1.0).epsilon(1e-9));
  }
}

TEST_CASE("finite differences: layer_norm's x, gamma and beta gradients, rows of features and of images") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  for (const Shape& shape : {Shape{3, 5}, Shape{1, 7}, Shape{2, 3, 2, 2}}) {
    CAPTURE(shape_string(shape));
    Graph g;
    const Shape example(shape.begin() + 1, shape.end());
    const auto x = g.param("x", shape, DType::f32);
    const auto gamma = g.param("gamma", example, DType::f32);
    const auto beta = g.param("beta", example, DType::f32);
    sg::test::check_gradients_through_mse(g, layer_norm(g, x, gamma, beta, 1e-3), rng, 0);
  }
  // Inside a network: linear -> layer_norm -> relu -> linear, every parameter checked.
  Graph g;
  const auto x = g.input("x", {4, 6}, DType::f32);
  const auto w1 = g.param("w1", {5, 6}, DType::f32);
  const auto b1 = g.param("b1", {5}, DType::f32);
  const auto gamma = g.param("gamma", {5}, DType::f32);
  const auto beta = g.param("beta", {5}, DType::f32);
  const auto w2 = g.param("w2", {3, 5}, DType::f32);
  const auto b2 = g.param("b2", {3}, DType::f32);
  const auto h = g.relu(layer_norm(g, g.linear(x, w1, b1), gamma, beta));
  sg::test::check_gradients_through_mse(g, g.linear(h, w2, b2), rng, 0);
}

TEST_CASE("autodiff asks layer_norm_backward for the gradients its inputs need, statistics recomputed from x") {
  Graph g;
  const auto x = g.input("x", {4, 6}, DType::f32);  // the batch: no gradient
  const auto gamma = g.param("gamma", {6}, DType::f32);
  const auto beta = g.param("beta", {6}, DType::f32);
  const auto y = layer_norm(g, x, gamma, beta);
  const auto loss = g.append_node(OpKind::mse_loss, {y, g.input("t", {4, 6}, DType::f32)}, NoAttrs{}).front();
  const auto grads = append_backward(g, loss);
  CHECK(grads.of_param.size() == 2);
  int backwards = 0;
  for (const Node& n : g.nodes())
    if (n.op == OpKind::layer_norm_backward) {
      ++backwards;
      CHECK(n.inputs.size() == 3);  // dY, X, gamma: no saved statistics
      CHECK(n.inputs[1] == x);
      CHECK(n.outputs.size() == 3);
    }
  CHECK(backwards == 1);
}

TEST_CASE("layer_norm's shape and eps errors name the op and the values") {
  Graph g;
  const auto x = g.input("x", {4, 2, 3, 3}, DType::f32);
  const auto ok = g.input("gamma", {2, 3, 3}, DType::f32);
  const auto flat = g.input("flat", {18}, DType::f32);
  CHECK_THROWS_WITH_AS(layer_norm(g, x, flat, flat),
                       doctest::Contains("layer_norm: 'flat' [18] f32 must have the per-example shape [2,3,3]"),
                       GraphError);
  CHECK_THROWS_WITH_AS(layer_norm(g, x, ok, flat), doctest::Contains("layer_norm"), GraphError);
  CHECK_THROWS_WITH_AS(layer_norm(g, x, ok, ok, 0.0), doctest::Contains("layer_norm: eps 0 must be > 0"), GraphError);
  CHECK_THROWS_WITH_AS(layer_norm(g, flat, flat, flat), doctest::Contains("must have rank >= 2"), GraphError);
  CHECK_NOTHROW(layer_norm(g, x, ok, ok));
}
