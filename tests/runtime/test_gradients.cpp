// Every differentiable op's autodiff gradient against central finite
// differences in f64, on random shapes and fresh random values.
#include <doctest/doctest.h>

#include <functional>

#include "graph/autodiff.hpp"
#include "runtime/cpu/cpu_executor.hpp"
#include "tests/runtime/finite_differences.hpp"
#include "tests/runtime/test_support.hpp"

using namespace sg;

namespace {

// Builds a graph ending in softmax_xent over a [rows, classes] logits value.
using Builder = std::function<ValueId(Graph&, std::int64_t rows, std::int64_t classes, std::mt19937_64&)>;

void check_against_finite_differences(const Builder& build) {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  std::uniform_int_distribution<std::int64_t> dim(1, 7);
  const auto rows = dim(rng), classes = dim(rng) + 1;
  INFO("rows " << rows << " classes " << classes);

  Graph g;
  const ValueId logits = build(g, rows, classes, rng);
  const ValueId labels = g.label("labels", {rows}, DType::i32);
  const ValueId loss = g.softmax_xent(logits, labels);
  const auto grads = append_backward(g, loss);

  CpuExecutor<double> exec(g);
  std::uniform_int_distribution<std::int32_t> label(0, static_cast<std::int32_t>(classes - 1));
  for (auto& y : exec.tensor(labels).i32) y = label(rng);
  for (const auto& v : g.values())
    if (v.role == Role::param || v.role == Role::input) sg::test::fill_uniform(exec.tensor(v.id).real, rng);
  exec.run();

  const auto analytic_of = sg::test::analytic_gradients(exec, grads);

  for (const auto& [param, grad] : grads.of_param) {
    const std::vector<double>& analytic = analytic_of.at(param);
    const std::vector<double> numeric = sg::test::numeric_gradient(exec, param, loss);
    INFO("parameter " << g.value(param).name);
    // Central differences are exact to ~1e-9 on smooth ops; ReLU kinks near
    // a perturbed value allow a little more.
    CHECK(sg::test::relative_error(analytic, numeric) < 1e-5);
  }
}

}  // namespace

TEST_CASE("matmul gradients, all transpose combinations") {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      INFO("trans_a " << ta << " trans_b " << tb);
      check_against_finite_differences([&](Graph& g, std::int64_t rows, std::int64_t classes, std::mt19937_64& rng) {
        const auto k = std::uniform_int_distribution<std::int64_t>(1, 6)(rng);
        const Shape a = ta ? Shape{k, rows} : Shape{rows, k};
        const Shape b = tb ? Shape{classes, k} : Shape{k, classes};
        return g.matmul(g.param("a", a, DType::f32), g.param("b", b, DType::f32), ta, tb);
      });
    }
}

TEST_CASE("bias_add and softmax cross-entropy gradients") {
  check_against_finite_differences([](Graph& g, std::int64_t rows, std::int64_t classes, std::mt19937_64&) {
    return g.bias_add(g.param("z", {rows, classes}, DType::f32), g.param("b", {classes}, DType::f32));
  });
}

TEST_CASE("relu gradient (through a linear layer)") {
  check_against_finite_differences([](Graph& g, std::int64_t rows, std::int64_t classes, std::mt19937_64&) {
    const auto x = g.input("x", {rows, 5}, DType::f32);
    const auto h = g.relu(g.linear(x, g.param("w1", {6, 5}, DType::f32), g.param("b1", {6}, DType::f32)));
    return g.linear(h, g.param("w2", {classes, 6}, DType::f32), g.param("b2", {classes}, DType::f32));
  });
}

TEST_CASE("cast gradient (fp32 master weights feeding fp16 compute)") {
  check_against_finite_differences([](Graph& g, std::int64_t rows, std::int64_t classes, std::mt19937_64&) {
    const auto x = g.input("x", {rows, 4}, DType::f16);
    const auto w = g.cast(g.param("w", {classes, 4}, DType::f32), DType::f16);
    return g.cast(g.matmul(x, w, false, true), DType::f32);
  });
}

TEST_CASE("add, and a value used twice (gradients accumulate)") {
  check_against_finite_differences([](Graph& g, std::int64_t rows, std::int64_t classes, std::mt19937_64&) {
    const auto x = g.input("x", {rows, 3}, DType::f32);
    const auto h = g.relu(g.matmul(x, g.param("w", {3, 4}, DType::f32)));
    const auto left = g.matmul(h, g.param("wl", {4, classes}, DType::f32));
    const auto right = g.matmul(h, g.param("wr", {4, classes}, DType::f32));
    return g.add(left, right);
  });
}

TEST_CASE("gelu gradient (exact erf GELU, through linear layers)") {
  check_against_finite_differences([](Graph& g, std::int64_t rows, std::int64_t classes, std::mt19937_64&) {
    const auto x = g.input("x", {rows, 5}, DType::f32);
    const auto h = g.gelu(g.linear(x, g.param("w1", {6, 5}, DType::f32), g.param("b1", {6}, DType::f32)));
    return g.linear(h, g.param("w2", {classes, 6}, DType::f32), g.param("b2", {classes}, DType::f32));
  });
  check_against_finite_differences([](Graph& g, std::int64_t rows, std::int64_t classes, std::mt19937_64&) {
    return g.gelu(g.param("z", {rows, classes}, DType::f32));  // gelu of the logits themselves
  });
}

TEST_CASE("gelu and gelu_backward reference values") {
  Graph g;
  const auto x = g.input("x", {5}, DType::f32);
  const auto dy = g.input("dy", {5}, DType::f32);
  const auto y = g.gelu(x);
  const auto dx = g.gelu_backward(dy, x);
  CpuExecutor<double> exec(g);
  exec.tensor(x).real = {-3.0, -1.0, 0.0, 1.0, 2.5};
  exec.tensor(dy).real = {1.0, 1.0, 1.0, 2.0, -1.0};
  exec.run();
  // x * Phi(x), and dy * (Phi(x) + x * phi(x)): exact values, not the tanh approximation's.
  const std::vector<double> want_y = {-0.00404969409489031, -0.15865525393145707, 0.0, 0.8413447460685429,
                                      2.4844758366855597};
  const std::vector<double> want_dx = {-0.01194564720418392, -0.08331547058768629, 0.5, 2.166630941175373,
                                       -1.037611085908145};
  CHECK(sg::test::relative_error(exec.tensor(y).real, want_y) < 1e-12);
  CHECK(sg::test::relative_error(exec.tensor(dx).real, want_dx) < 1e-11);
}

TEST_CASE("a node with two outputs (bias_add_relu): gradients of both outputs") {
  // Both outputs reach the loss: dZ + relu_backward(dA, A).
  check_against_finite_differences([](Graph& g, std::int64_t rows, std::int64_t classes, std::mt19937_64&) {
    const auto x = g.input("x", {rows, 5}, DType::f32);
    const auto za = g.bias_add_relu(g.matmul(x, g.param("w1", {6, 5}, DType::f32), false, true),
                                    g.param("b1", {6}, DType::f32));
    const auto from_a = g.matmul(za[1], g.param("wa", {classes, 6}, DType::f32), false, true);
    const auto from_z = g.matmul(za[0], g.param("wz", {classes, 6}, DType::f32), false, true);
    return g.add(from_a, from_z);
  });
  // Only one output reaches the loss (the other's gradient is absent).
  for (int used : {0, 1}) {
    INFO("only output " << used);
    check_against_finite_differences([&](Graph& g, std::int64_t rows, std::int64_t classes, std::mt19937_64&) {
      const auto x = g.input("x", {rows, 5}, DType::f32);
      const auto za = g.bias_add_relu(g.matmul(x, g.param("w1", {6, 5}, DType::f32), false, true),
                                      g.param("b1", {6}, DType::f32));
      return g.matmul(za[static_cast<std::size_t>(used)], g.param("w2", {classes, 6}, DType::f32), false, true);
    });
  }
}

TEST_CASE("the learning rate is the executor's optimizer scalar, not an attribute") {
  Graph g;
  const auto w = g.param("w", {2, 2}, DType::f32);
  const auto dw = g.input("dw", {2, 2}, DType::f32);
  g.sgd_update(w, dw, 0.0, 0.5);
  CpuExecutor<double> exec(g);
  exec.tensor(w).real = {1.0, 2.0, -1.0, 4.0};
  exec.tensor(dw).real = {0.5, 0.0, 1.0, -2.0};
  CHECK_THROWS_WITH_AS(exec.run(), doctest::Contains("no learning rate"), GraphError);
  CHECK_THROWS_WITH_AS(exec.set_learning_rate(0.0), doctest::Contains("learning rate"), GraphError);
  CHECK_THROWS_WITH_AS(exec.set_learning_rate(-0.1), doctest::Contains("learning rate"), GraphError);
  exec.set_learning_rate(0.1);
  exec.run();  // w -= lr * (dw + wd * w)
  CHECK(exec.tensor(w).real == std::vector<double>{1.0 - 0.1 * 1.0, 2.0 - 0.1 * 1.0, -1.0 - 0.1 * 0.5, 4.0 - 0.1 * 0.0});
  exec.set_learning_rate(1.0);  // a schedule step: the same graph, a new scalar
  exec.run();
  CHECK(exec.tensor(w).real[0] == doctest::Approx(0.9 - (0.5 + 0.45)));
  CHECK(*exec.learning_rate() == 1.0);
}

TEST_CASE("ops without a gradient rule are rejected") {
  Graph g;
  const auto p = g.param("p", {3, 4}, DType::f32);
  const auto labels = g.label("y", {3}, DType::i32);
  const auto r = g.reduce_rows(p);  // reduce_rows is a backward-only op
  const auto logits = g.bias_add(g.input("z", {3, 4}, DType::f32), r);
  const auto loss = g.softmax_xent(logits, labels);
  CHECK_THROWS_WITH_AS(append_backward(g, loss), doctest::Contains("reduce_rows"), GraphError);
}
