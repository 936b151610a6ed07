#pragma once
// The finite-difference side of the gradient tests: autodiff's gradients
// read at the unperturbed point, and central differences of the loss, on the
// f64 CPU executor. Each test keeps its own tolerance and checks.
#include <map>
#include <vector>

#include "graph/autodiff.hpp"
#include "runtime/cpu/cpu_executor.hpp"

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

}  // namespace sg::test
