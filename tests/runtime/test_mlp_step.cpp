// The MLP's autodiff gradients equal the hand derivation, and SGD steps of
// the full training graph equal the update formula.
#include <doctest/doctest.h>

#include <cmath>
#include <numeric>

#include "models/mlp.hpp"
#include "ops/cpu/reference_ops.hpp"
#include "runtime/cpu/cpu_executor.hpp"
#include "tests/runtime/random_mlp_problem.hpp"
#include "tests/runtime/test_support.hpp"

using namespace sg;

namespace {

using Problem = sg::test::MlpProblem;
using sg::test::random_mlp_problem;

template <typename T>
void load(CpuExecutor<T>& exec, const Problem& p, std::mt19937_64& rng) {
  sg::test::load_mlp_data(exec, p);
  for (ValueId id : exec.graph().values_with_role(Role::param)) sg::test::fill_uniform(exec.tensor(id).real, rng);
}

using Matrix = std::vector<double>;

// Hand-derived backward pass of Linear-ReLU-Linear-ReLU-Linear + softmax CE.
std::map<std::string, Matrix> hand_gradients(CpuExecutor<double>& exec, const Problem& p) {
  const auto B = p.spec.batch;
  const auto& L = p.spec.layers;
  std::vector<Matrix> act{Matrix(static_cast<std::size_t>(B * L[0]))};
  std::vector<std::int32_t> y(static_cast<std::size_t>(B));
  for (std::int64_t i = 0; i < B; ++i) {
    const auto row = p.perm[static_cast<std::size_t>(i)];
    y[static_cast<std::size_t>(i)] = p.labels[static_cast<std::size_t>(row)];
    for (std::int64_t j = 0; j < L[0]; ++j)
      act[0][static_cast<std::size_t>(i * L[0] + j)] = p.images[static_cast<std::size_t>(row * L[0] + j)] / 255.0;
  }
  std::vector<Matrix> pre;  // z_l
  for (std::size_t l = 1; l < L.size(); ++l) {
    Matrix z(static_cast<std::size_t>(B * L[l]));
    const auto& w = exec.tensor(names::weight(l)).real;
    const auto& b = exec.tensor(names::bias(l)).real;
    for (std::int64_t i = 0; i < B; ++i)
      for (std::int64_t o = 0; o < L[l]; ++o) {
        double s = b[static_cast<std::size_t>(o)];
        for (std::int64_t k = 0; k < L[l - 1]; ++k)
          s += act.back()[static_cast<std::size_t>(i * L[l - 1] + k)] * w[static_cast<std::size_t>(o * L[l - 1] + k)];
        z[static_cast<std::size_t>(i * L[l] + o)] = s;
      }
    pre.push_back(z);
    Matrix h = z;
    if (l + 1 < L.size())
      for (auto& v : h) v = std::max(v, 0.0);
    act.push_back(h);
  }
  // dz of the logits: (softmax - onehot) / B
  const auto C = L.back();
  Matrix dz(static_cast<std::size_t>(B * C));
  for (std::int64_t i = 0; i < B; ++i) {
    const double* row = &pre.back()[static_cast<std::size_t>(i * C)];
    double mx = *std::max_element(row, row + C), sum = 0;
    for (std::int64_t c = 0; c < C; ++c) sum += std::exp(row[c] - mx);
    for (std::int64_t c = 0; c < C; ++c)
      dz[static_cast<std::size_t>(i * C + c)] = (std::exp(row[c] - mx) / sum - (y[static_cast<std::size_t>(i)] == c)) / B;
  }
  std::map<std::string, Matrix> grads;
  for (std::size_t l = L.size() - 1; l >= 1; --l) {
    const auto in = L[l - 1], out = L[l];
    Matrix dw(static_cast<std::size_t>(out * in), 0.0), db(static_cast<std::size_t>(out), 0.0);
    for (std::int64_t i = 0; i < B; ++i)
      for (std::int64_t o = 0; o < out; ++o) {
        const double g = dz[static_cast<std::size_t>(i * out + o)];
        db[static_cast<std::size_t>(o)] += g;
        for (std::int64_t k = 0; k < in; ++k)
          dw[static_cast<std::size_t>(o * in + k)] += g * act[l - 1][static_cast<std::size_t>(i * in + k)];
      }
    grads[names::weight(l)] = dw;
    grads[names::bias(l)] = db;
    if (l == 1) break;
    const auto& w = exec.tensor(names::weight(l)).real;
    Matrix dprev(static_cast<std::size_t>(B * in), 0.0);
    for (std::int64_t i = 0; i < B; ++i)
      for (std::int64_t k = 0; k < in; ++k) {
        double s = 0;
        for (std::int64_t o = 0; o < out; ++o)
          s += dz[static_cast<std::size_t>(i * out + o)] * w[static_cast<std::size_t>(o * in + k)];
        dprev[static_cast<std::size_t>(i * in + k)] = pre[l - 2][static_cast<std::size_t>(i * in + k)] > 0 ? s : 0.0;
      }
    dz = dprev;
  }
  return grads;
}

}  // namespace

TEST_CASE("autodiff of the MLP equals the hand derivation") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  const Problem p = random_mlp_problem(rng);
  Graph g = build_mlp_forward(p.spec);
  const auto grads = append_backward(g, g.value_named(names::loss));
  CpuExecutor<double> exec(g);
  load(exec, p, rng);
  exec.run();
  const auto expected = hand_gradients(exec, p);
  REQUIRE(expected.size() == grads.of_param.size());
  for (const auto& [param, grad] : grads.of_param) {
    const auto& name = g.value(param).name;
    INFO("parameter " << name);
    CHECK(sg::test::relative_error(exec.tensor(grad).real, expected.at(name)) < 1e-12);
  }
}

TEST_CASE("two SGD steps with momentum and weight decay equal the formula") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  const Problem p = random_mlp_problem(rng);
  const OptimizerSpec sgd{0.05, 0.9, 0.01};
  const auto stages = build_training_stages(p.spec, sgd);
  CpuExecutor<double> step_exec(stages.fused);   // what training runs
  step_exec.set_learning_rate(sgd.lr);            // the optimizer's run state, not IR
  CpuExecutor<double> grad_exec(stages.backward);  // gradients only, no update
  load(step_exec, p, rng);
  load(grad_exec, p, rng);

  std::map<std::string, Matrix> w, v;
  const auto params = stages.fused.values_with_role(Role::param);
  for (ValueId id : params) {
    const auto& name = stages.fused.value(id).name;
    w[name] = step_exec.tensor(id).real;
    v[name] = Matrix(w[name].size(), 0.0);
  }
  for (int step = 0; step < 2; ++step) {
    // Reference: gradient at the current weights for this step's batch, then the formula.
    grad_exec.tensor(names::step).i32[0] = step;
    for (const auto& [name, values] : w) grad_exec.tensor(name).real = values;
    grad_exec.run();
    for (auto& [name, values] : w) {
      const auto& g = grad_exec.tensor("grad_" + name).real;
      for (std::size_t i = 0; i < values.size(); ++i) {
        v[name][i] = sgd.momentum * v[name][i] + g[i] + sgd.weight_decay * values[i];
        values[i] -= sgd.lr * v[name][i];
      }
    }
    step_exec.run();
    CHECK(step_exec.tensor(names::step).i32[0] == step + 1);
    for (const auto& [name, values] : w) {
      INFO("step " << step << " parameter " << name);
      CHECK(sg::test::relative_error(step_exec.tensor(name).real, values) < 1e-12);
      CHECK(sg::test::relative_error(step_exec.tensor("vel_" + name).real, v[name]) < 1e-12);
    }
  }
  // The update really moved the weights (the check above cannot pass vacuously).
  CHECK(sg::test::relative_error(step_exec.tensor("w1").real, grad_exec.tensor("w1").real) > 1e-6);
}

TEST_CASE("batch fetch takes consecutive slices of the permutation, wrapping each epoch") {
  std::vector<std::int32_t> perm{4, 2, 0, 3, 1, 6, 5};
  std::vector<std::int32_t> idx(3);
  ref::batch_indices(perm.data(), 7, 1, 3, idx.data());
  CHECK(idx == std::vector<std::int32_t>{3, 1, 6});
  ref::batch_indices(perm.data(), 7, 2, 3, idx.data());  // 2 batches per epoch: wraps to the start
  CHECK(idx == std::vector<std::int32_t>{4, 2, 0});
}
