// Issue 21's activations and losses: each op's autodiff gradient against
// central finite differences in f64 (random shapes, fresh random values),
// and each forward against an independent formula.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "graph/autodiff.hpp"
#include "runtime/cpu/cpu_executor.hpp"
#include "tests/runtime/finite_differences.hpp"
#include "tests/runtime/test_support.hpp"

using namespace sg;

namespace {

// ||analytic - numeric|| relative to ||numeric||, floored at 1e-4: a
// gradient that is exactly zero (l1's signs cancelling over two rows) has a
// numeric twin of ~1e-11 round-off, which a plain relative error would call
// 100% wrong. NaN never passes.
double gradient_error(const std::vector<double>& analytic, const std::vector<double>& numeric) {
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < analytic.size(); ++i) {
    if (!std::isfinite(analytic[i]) || !std::isfinite(numeric[i])) return INFINITY;
    diff += (analytic[i] - numeric[i]) * (analytic[i] - numeric[i]);
    ref += numeric[i] * numeric[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(ref), 1e-4);
}

// Builds a graph and returns its scalar loss.
using LossBuilder = std::function<ValueId(Graph&, std::int64_t rows, std::int64_t cols, std::mt19937_64&)>;

// Fills every param with U(-1, 1), every input with U(lo, hi), integer labels with
// classes in [0, cols), float labels (regression targets) with U(-1, 1);
// then compares every parameter's gradient with central differences.
void check_gradients(const LossBuilder& build, double lo = -1.0, double hi = 1.0, double tolerance = 1e-6) {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  std::uniform_int_distribution<std::int64_t> dim(1, 7);
  const auto rows = dim(rng), cols = dim(rng) + 1;
  INFO("rows " << rows << " cols " << cols);

  Graph g;
  const ValueId loss = build(g, rows, cols, rng);
  const auto grads = append_backward(g, loss);
  REQUIRE(!grads.of_param.empty());

  CpuExecutor<double> exec(g);
  std::uniform_int_distribution<std::int32_t> label(0, static_cast<std::int32_t>(cols - 1));
  for (const auto& v : g.values()) {
    if (v.role == Role::param) sg::test::fill_uniform(exec.tensor(v.id).real, rng);
    if (v.role == Role::input) sg::test::fill_uniform(exec.tensor(v.id).real, rng, lo, hi);
    if (v.role == Role::label && v.dtype == DType::i32)
      for (auto& y : exec.tensor(v.id).i32) y = label(rng);
    if (v.role == Role::label && is_floating(v.dtype)) sg::test::fill_uniform(exec.tensor(v.id).real, rng);
  }
  exec.run();
  const auto analytic_of = sg::test::analytic_gradients(exec, grads);

  for (const auto& [param, grad] : grads.of_param) {
    const std::vector<double>& analytic = analytic_of.at(param);
    const std::vector<double> numeric = sg::test::numeric_gradient(exec, param, loss);
    INFO("parameter " << g.value(param).name);
    CHECK(gradient_error(analytic, numeric) < tolerance);
  }
}

ValueId unary(Graph& g, OpKind op, ValueId x) { return g.append_node(op, {x}, NoAttrs{}).front(); }

// softmax_xent(linear(act(linear(x)))) with the activation between.
LossBuilder through_layers(OpKind activation) {
  return [activation](Graph& g, std::int64_t rows, std::int64_t classes, std::mt19937_64&) {
    const auto x = g.input("x", {rows, 5}, DType::f32);
    const auto h = unary(g, activation, g.linear(x, g.param("w1", {6, 5}, DType::f32), g.param("b1", {6}, DType::f32)));
    const auto logits = g.linear(h, g.param("w2", {classes, 6}, DType::f32), g.param("b2", {classes}, DType::f32));
    return g.softmax_xent(logits, g.label("labels", {rows}, DType::i32));
  };
}

// Runs one unary op forward on `xs` in f64.
std::vector<double> run_unary(OpKind op, const std::vector<double>& xs) {
  Graph g;
  const auto x = g.input("x", {static_cast<std::int64_t>(xs.size())}, DType::f32);
  const auto y = unary(g, op, x);
  CpuExecutor<double> exec(g);
  exec.tensor(x).real = xs;
  exec.run();
  return exec.tensor(y).real;
}

}  // namespace

TEST_CASE("activation gradients (gelu_tanh, silu, tanh, sigmoid) through linear layers") {
  for (OpKind op : {OpKind::gelu_tanh, OpKind::silu, OpKind::tanh, OpKind::sigmoid}) {
    INFO("activation " << op_name(op));
    // Inputs up to +-3 reach the saturating parts of tanh and sigmoid (weights
    // stay in +-1: large ones saturate the softmax, whose tiny gradients the
    // central differences cannot resolve to 1e-6).
    check_gradients(through_layers(op), -3.0, 3.0);
  }
}

TEST_CASE("activation forwards match their definitions") {
  std::vector<double> xs;
  for (int i = -60; i <= 60; ++i) xs.push_back(i / 10.0);
  const auto gelu_tanh = run_unary(OpKind::gelu_tanh, xs);
  const auto gelu_exact = run_unary(OpKind::gelu, xs);
  const auto silu = run_unary(OpKind::silu, xs);
  const auto tanh = run_unary(OpKind::tanh, xs);
  const auto sigmoid = run_unary(OpKind::sigmoid, xs);
  double worst_gelu_gap = 0.0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const double x = xs[i];
    INFO("x = " << x);
    // The tanh approximation stays within 5e-4 of the exact (erf) GELU on
    // [-6, 6] but is not it (the gap is ~1e-4 near |x| = 2).
    worst_gelu_gap = std::max(worst_gelu_gap, std::abs(gelu_tanh[i] - gelu_exact[i]));
    CHECK(std::abs(gelu_tanh[i] - gelu_exact[i]) < 5e-4);
    CHECK(sigmoid[i] == doctest::Approx(std::exp(x) / (1.0 + std::exp(x))).epsilon(1e-12));
    CHECK(silu[i] == doctest::Approx(x * std::exp(x) / (1.0 + std::exp(x))).epsilon(1e-12));
    CHECK(tanh[i] == doctest::Approx((std::exp(2 * x) - 1) / (std::exp(2 * x) + 1)).epsilon(1e-12));
  }
  CHECK(worst_gelu_gap > 1e-5);
}

TEST_CASE("mse_loss and l1_loss gradients (float targets)") {
  for (OpKind op : {OpKind::mse_loss, OpKind::l1_loss}) {
    INFO("loss " << op_name(op));
    check_gradients([op](Graph& g, std::int64_t rows, std::int64_t cols, std::mt19937_64&) {
      const auto x = g.input("x", {rows, 4}, DType::f32);
      const auto h = g.relu(g.linear(x, g.param("w1", {5, 4}, DType::f32), g.param("b1", {5}, DType::f32)));
      const auto pred = g.linear(h, g.param("w2", {cols, 5}, DType::f32), g.param("b2", {cols}, DType::f32));
      return g.append_node(op, {pred, g.label("targets", {rows, cols}, DType::f32)}, NoAttrs{}).front();
    });
  }
}

TEST_CASE("mse_loss and l1_loss values are the means over every element") {
  Graph g;
  const auto pred = g.input("pred", {2, 3}, DType::f32);
  const auto target = g.label("target", {2, 3}, DType::f32);
  const auto mse = g.append_node(OpKind::mse_loss, {pred, target}, NoAttrs{}).front();
  const auto l1 = g.append_node(OpKind::l1_loss, {pred, target}, NoAttrs{}).front();
  CpuExecutor<double> exec(g);
  auto rng = sg::test::fresh_rng();
  sg::test::fill_uniform(exec.tensor(pred).real, rng);
  sg::test::fill_uniform(exec.tensor(target).real, rng);
  exec.run();
  double sq = 0, ab = 0;
  for (std::size_t i = 0; i < 6; ++i) {
    const double d = exec.tensor(pred).real[i] - exec.tensor(target).real[i];
    sq += d * d;
    ab += std::abs(d);
  }
  CHECK(exec.tensor(mse).real[0] == doctest::Approx(sq / 6).epsilon(1e-12));
  CHECK(exec.tensor(l1).real[0] == doctest::Approx(ab / 6).epsilon(1e-12));
}

TEST_CASE("a regression loss rejects a target of another shape") {
  Graph g;
  const auto pred = g.input("pred", {4, 3}, DType::f32);
  const auto target = g.label("target", {4, 2}, DType::f32);
  CHECK_THROWS_WITH_AS(g.append_node(OpKind::mse_loss, {pred, target}, NoAttrs{}),
                       doctest::Contains("differ in shape"), GraphError);
}

TEST_CASE("label-smoothed cross-entropy gradient") {
  for (double eps : {0.0, 0.1, 0.5}) {
    INFO("eps " << eps);
    check_gradients([eps](Graph& g, std::int64_t rows, std::int64_t classes, std::mt19937_64&) {
      const auto x = g.input("x", {rows, 4}, DType::f32);
      const auto logits = g.linear(x, g.param("w", {classes, 4}, DType::f32), g.param("b", {classes}, DType::f32));
      return g.append_node(OpKind::softmax_xent_smoothed, {logits, g.label("labels", {rows}, DType::i32)},
                           LabelSmoothingAttrs{eps})
          .front();
    });
  }
}

TEST_CASE("label-smoothed cross-entropy is -sum q log softmax with q = (1-eps) onehot + eps/C") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  const std::int64_t rows = 5, classes = 7;
  const double eps = 0.2;
  Graph g;
  const auto logits = g.input("logits", {rows, classes}, DType::f32);
  const auto labels = g.label("labels", {rows}, DType::i32);
  const auto smoothed =
      g.append_node(OpKind::softmax_xent_smoothed, {logits, labels}, LabelSmoothingAttrs{eps}).front();
  const auto plain = g.softmax_xent(logits, labels);
  CpuExecutor<double> exec(g);
  sg::test::fill_uniform(exec.tensor(logits).real, rng, -4.0, 4.0);
  for (std::int64_t i = 0; i < rows; ++i) exec.tensor(labels).i32[i] = static_cast<std::int32_t>((i * 3) % classes);
  exec.run();
  double expected = 0;
  for (std::int64_t i = 0; i < rows; ++i) {
    const double* row = exec.tensor(logits).real.data() + i * classes;
    double z = 0;
    for (std::int64_t c = 0; c < classes; ++c) z += std::exp(row[c]);
    for (std::int64_t c = 0; c < classes; ++c) {
      const double q = (c == exec.tensor(labels).i32[i] ? 1 - eps : 0) + eps / classes;
      expected -= q * std::log(std::exp(row[c]) / z);
    }
  }
  CHECK(exec.tensor(smoothed).real[0] == doctest::Approx(expected / rows).epsilon(1e-12));
  CHECK(exec.tensor(smoothed).real[0] != doctest::Approx(exec.tensor(plain).real[0]));
}

// A data-parallel rank of N scales its loss gradient by 1/N (issue 38): each
// loss backward's output is then its scale times the mean loss's gradient,
// and a scale that is not finite and > 0 is refused when the node is made.
TEST_CASE("a loss backward's gradient scale multiplies the mean loss's gradient") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  const std::int64_t rows = 6, cols = 5;
  Graph g;
  const auto x = g.input("x", {rows, cols}, DType::f32);
  const auto labels = g.label("labels", {rows}, DType::i32);
  const auto target = g.label("target", {rows, cols}, DType::f32);
  struct Pair {
    ValueId plain, scaled;
  };
  std::vector<Pair> pairs;
  const double scale = 0.25;
  for (const OpKind op : {OpKind::mse_loss_backward, OpKind::l1_loss_backward})
    pairs.push_back({g.append_node(op, {x, target}, LossGradientAttrs{}).front(),
                     g.append_node(op, {x, target}, LossGradientAttrs{scale}).front()});
  pairs.push_back({g.append_node(OpKind::softmax_xent_backward, {x, labels}, LossGradientAttrs{}).front(),
                   g.append_node(OpKind::softmax_xent_backward, {x, labels}, LossGradientAttrs{scale}).front()});
  pairs.push_back(
      {g.append_node(OpKind::softmax_xent_smoothed_backward, {x, labels}, LabelSmoothingAttrs{0.1}).front(),
       g.append_node(OpKind::softmax_xent_smoothed_backward, {x, labels}, LabelSmoothingAttrs{0.1, scale}).front()});
  CpuExecutor<double> exec(g);
  sg::test::fill_uniform(exec.tensor(x).real, rng, -2.0, 2.0);
  sg::test::fill_uniform(exec.tensor(target).real, rng, -2.0, 2.0);
  for (std::int64_t i = 0; i < rows; ++i) exec.tensor(labels).i32[i] = static_cast<std::int32_t>((i * 2) % cols);
  exec.run();
  for (const Pair& p : pairs) {
    INFO(op_name(g.node(g.value(p.plain).producer).op));
    const auto &plain = exec.tensor(p.plain).real, &scaled = exec.tensor(p.scaled).real;
    REQUIRE(plain.size() == scaled.size());
    double norm = 0;
    for (std::size_t i = 0; i < plain.size(); ++i) {
      CHECK(scaled[i] == plain[i] * scale);  // a power of two: exact
      norm += plain[i] * plain[i];
    }
    CHECK(norm > 0);
  }
  for (const double bad : {0.0, -1.0, double(NAN), double(INFINITY)})
    CHECK_THROWS_WITH_AS(g.append_node(OpKind::softmax_xent_backward, {x, labels}, LossGradientAttrs{bad}),
                         doctest::Contains("gradient scale"), GraphError);
}
