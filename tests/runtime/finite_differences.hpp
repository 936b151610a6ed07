#pragma once
// The finite-difference side of the gradient tests: autodiff's gradients
// read at the unperturbed point, and central differences of the loss, on the
// f64 CPU executor. Each test keeps its own tolerance and checks.
#include <doctest/doctest.h>

#include <map>
#include <random>
#include <vector>

#include "graph/autodiff.hpp"
#include "runtime/cpu/cpu_executor.hpp"
#include "tests/runtime/test_support.hpp"

namespace sg::test {

// Every parameter's gradient after the executor's last run. Read them all
// before any numeric_gradient: each of its runs recomputes them at a
// perturbed point (taken after one, a later parameter's gradient would be
// off by eps x the Hessian, ~1e-5 relative).
inline std::map<ValueId, std::vector<double>> analytic_gradients(CpuExecutor<double>& exec, const GradientMap& grads) {
  std::map<ValueId, std::vector<double>> out;
  for (const auto& [param, grad] : grads.of_param) out[param] = exec.tensor(grad).real;
  return out;
}

// (loss(p + eps) - loss(p - eps)) / 2 eps for every element of `param`,
// each element restored afterwards; `loss` is a scalar output.
inline std::vector<double> numeric_gradient(CpuExecutor<double>& exec, ValueId param, ValueId loss,
                                            double eps = 1e-6) {
  auto& w = exec.tensor(param).real;
  std::vector<double> numeric(w.size());
  for (std::size_t i = 0; i < w.size(); ++i) {
    const double saved = w[i];
    w[i] = saved + eps;
    exec.run();
    const double up = exec.tensor(loss).real[0];
    w[i] = saved - eps;
    exec.run();
    const double down = exec.tensor(loss).real[0];
    w[i] = saved;
    numeric[i] = (up - down) / (2 * eps);
  }
  return numeric;
}

// Appends flatten(out) -> mse_loss against a random target, fills every
// param and input with uniform values in [-1, 1] (i32 states, the step
// counter, get `step`), and checks each param's autodiff gradient against
// central differences (relative error by norm < 1e-5). Params are the values
// to differentiate (make the op's input a param to check dX).
inline void check_gradients_through_mse(Graph g, ValueId out, std::mt19937_64& rng, std::int32_t step) {
  const ValueId pred = g.flatten(out);
  const ValueId target = g.input("target", g.value(pred).shape, DType::f32);
  const ValueId loss = g.append_node(OpKind::mse_loss, {pred, target}, NoAttrs{}).front();
  const auto grads = append_backward(g, loss);

  CpuExecutor<double> exec(g);
  for (const auto& v : g.values()) {
    if (v.role == Role::param || v.role == Role::input) fill_uniform(exec.tensor(v.id).real, rng);
    if (v.role == Role::state && v.dtype == DType::i32) exec.tensor(v.id).i32.assign(1, step);
  }
  exec.run();
  const auto analytic_of = analytic_gradients(exec, grads);

  for (const auto& [param, grad] : grads.of_param) {
    const std::vector<double>& analytic = analytic_of.at(param);
    const std::vector<double> numeric = numeric_gradient(exec, param, loss);
    INFO("parameter " << g.value(param).name << " " << shape_string(g.value(param).shape));
    double norm = 0;
    for (double a : analytic) norm += a * a;
    CHECK(norm > 0);  // a gradient that is all zero would pass vacuously
    CHECK(relative_error(analytic, numeric) < 1e-5);
  }
}

}  // namespace sg::test
