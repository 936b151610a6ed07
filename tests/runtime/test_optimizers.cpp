// Adam, AdamW, Nesterov SGD and gradient clipping (issue 21): each update
// op's CPU reference against an independent implementation of PyTorch's
// formulas over several steps, the optimizer pass's graph, whole training
// steps against gradients + the formulas, and bit-exact resume.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <numeric>

#include "models/mlp.hpp"
#include "runtime/cpu/cpu_executor.hpp"
#include "runtime/data/idx_reader.hpp"
#include "runtime/trainer.hpp"
#include "tests/runtime/random_mlp_problem.hpp"
#include "tests/runtime/test_support.hpp"
#include "tests/support/test_data.hpp"
#include "tests/support/training_helpers.hpp"

using namespace sg;

namespace {

using Vec = std::vector<double>;

// torch.optim.Adam/AdamW step written the way torch/optim/adam.py reads
// (bias-corrected moments, lerp), independent of ref::adam_update.
struct TorchAdam {
  double lr, beta1, beta2, eps, wd;
  bool decoupled;
  Vec m, v;
  int t = 0;
  void step(Vec& w, Vec g) {
    ++t;
    if (m.empty()) m.assign(w.size(), 0.0), v.assign(w.size(), 0.0);
    for (std::size_t i = 0; i < w.size(); ++i) {
      if (decoupled) w[i] = w[i] - lr * wd * w[i];
      else g[i] = g[i] + wd * w[i];
      m[i] = m[i] + (g[i] - m[i]) * (1.0 - beta1);  // exp_avg.lerp_(grad, 1 - beta1)
      v[i] = v[i] * beta2 + (1.0 - beta2) * g[i] * g[i];
      const double m_hat = m[i] / (1.0 - std::pow(beta1, t));
      const double v_hat = v[i] / (1.0 - std::pow(beta2, t));
      w[i] = w[i] - lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }
};

Vec random_vec(std::size_t n, std::mt19937_64& rng, double scale = 1.0) {
  Vec v(n);
  sg::test::fill_uniform(v, rng, -scale, scale);
  return v;
}

// One adam_update node on a [rows, cols] parameter, run by the CPU executor.
struct AdamGraph {
  Graph g;
  ValueId w, grad, m, v, step, scale = -1;
  AdamGraph(Shape shape, const AdamUpdateAttrs& attrs, bool with_scale) {
    w = g.param("w", shape, DType::f32);
    grad = g.input("g", shape, DType::f32);
    m = g.state("m", shape, DType::f32);
    v = g.state("v", shape, DType::f32);
    step = g.state("step", {1}, DType::i32);
    std::vector<ValueId> in{w, grad, m, v, step};
    if (with_scale) in.push_back(scale = g.input("scale", {1}, DType::f32));
    g.append_node(OpKind::adam_update, in, attrs);
  }
};

}  // namespace

TEST_CASE("adam_update's CPU reference equals PyTorch's Adam and AdamW over several steps") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  for (bool decoupled : {false, true})
    for (double wd : {0.0, 0.05})
      for (bool clip : {false, true}) {
        INFO("decoupled " << decoupled << " weight decay " << wd << " clip scale " << clip);
        const AdamUpdateAttrs attrs{0.85, 0.99, 1e-6, wd, decoupled};
        AdamGraph a({7, 5}, attrs, clip);
        CpuExecutor<double> exec(a.g);
        const double lr = 0.01;
        exec.set_learning_rate(lr);
        Vec w = random_vec(35, rng);
        exec.tensor(a.w).real = w;
        TorchAdam torch{lr, attrs.beta1, attrs.beta2, attrs.eps, wd, decoupled, {}, {}};
        for (int s = 0; s < 6; ++s) {
          Vec g = random_vec(35, rng, 2.0);
          const double scale = clip ? 0.25 + 0.1 * s : 1.0;
          exec.tensor(a.grad).real = g;
          if (clip) exec.tensor(a.scale).real = {scale};
          exec.tensor(a.step).i32[0] = s;  // the graph's step counter before its advance: t = s + 1
          exec.run();
          for (auto& x : g) x *= scale;
          torch.step(w, g);
          INFO("step " << s);
          CHECK(sg::test::relative_error(exec.tensor(a.w).real, w) < 1e-12);
          CHECK(sg::test::relative_error(exec.tensor(a.m).real, torch.m) < 1e-12);
          CHECK(sg::test::relative_error(exec.tensor(a.v).real, torch.v) < 1e-12);
        }
        // The first step moves each weight by about lr (Adam's normalised step): not vacuous.
        CHECK(sg::test::relative_error(exec.tensor(a.w).real, Vec(35, 0.0)) > 0);
      }
}

TEST_CASE("adam_update's shape rule rejects bad moments, steps and betas") {
  Graph g;
  const ValueId w = g.param("w", {4, 3}, DType::f16);
  const ValueId grad = g.input("g", {4, 3}, DType::f16);
  const ValueId m = g.state("m", {4, 3}, DType::f32);
  const ValueId v = g.state("v", {4, 3}, DType::f32);
  const ValueId m16 = g.state("m16", {4, 3}, DType::f16);
  const ValueId step = g.state("step", {1}, DType::i32);
  const ValueId fstep = g.state("fstep", {1}, DType::f32);
  CHECK_NOTHROW(g.append_node(OpKind::adam_update, {w, grad, m, v, step}, AdamUpdateAttrs{}));
  CHECK_THROWS_WITH_AS(g.append_node(OpKind::adam_update, {w, grad, m16, v, step}, AdamUpdateAttrs{}),
                       doctest::Contains("must be f32"), GraphError);
  CHECK_THROWS_WITH_AS(g.append_node(OpKind::adam_update, {w, grad, m, v, fstep}, AdamUpdateAttrs{}),
                       doctest::Contains("must be i32 [1]"), GraphError);
  CHECK_THROWS_WITH_AS(g.append_node(OpKind::adam_update, {w, grad, m, v, step}, AdamUpdateAttrs{1.0, 0.999, 1e-8, 0, false}),
                       doctest::Contains("betas"), GraphError);
}

TEST_CASE("Nesterov SGD's CPU reference equals PyTorch's SGD(nesterov=True)") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  Graph g;
  const ValueId w = g.param("w", {6, 4}, DType::f32);
  const ValueId grad = g.input("g", {6, 4}, DType::f32);
  const ValueId vel = g.state("vel", {6, 4}, DType::f32);
  const double lr = 0.1, mu = 0.9, wd = 0.01;
  g.sgd_update(w, grad, mu, wd, vel);
  Graph nesterov;
  {
    // The same node with nesterov set (Graph::sgd_update spells the plain form).
    const ValueId w2 = nesterov.param("w", {6, 4}, DType::f32);
    const ValueId g2 = nesterov.input("g", {6, 4}, DType::f32);
    const ValueId v2 = nesterov.state("vel", {6, 4}, DType::f32);
    nesterov.append_node(OpKind::sgd_update, {w2, g2, v2}, SgdUpdateAttrs{mu, wd, true});
  }
  CpuExecutor<double> exec(nesterov);
  exec.set_learning_rate(lr);
  Vec weights = random_vec(24, rng), buf(24, 0.0);
  exec.tensor("w").real = weights;
  for (int s = 0; s < 4; ++s) {
    const Vec gr = random_vec(24, rng);
    exec.tensor("g").real = gr;
    exec.run();
    for (std::size_t i = 0; i < 24; ++i) {  // torch/optim/sgd.py
      const double d_p = gr[i] + wd * weights[i];
      buf[i] = s == 0 ? d_p : mu * buf[i] + d_p;
      weights[i] -= lr * (d_p + mu * buf[i]);
    }
    INFO("step " << s);
    CHECK(sg::test::relative_error(exec.tensor("w").real, weights) < 1e-12);
    CHECK(sg::test::relative_error(exec.tensor("vel").real, buf) < 1e-12);
  }
  CHECK_THROWS_WITH_AS(g.append_node(OpKind::sgd_update, {w, grad}, SgdUpdateAttrs{0.0, 0.0, true}),
                       doctest::Contains("nesterov needs momentum"), GraphError);
}

TEST_CASE("grad_clip_scale is clip_grad_norm_'s factor over every gradient, scale_grad applies it") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  for (double max_norm : {0.5, 1000.0}) {
    Graph g;
    const ValueId a = g.input("a", {5, 3}, DType::f32);
    const ValueId b = g.input("b", {7}, DType::f32);
    const ValueId scale = g.append_node(OpKind::grad_clip_scale, {a, b}, ClipGradAttrs{max_norm}).front();
    const ValueId scaled = g.append_node(OpKind::scale_grad, {b, scale}, NoAttrs{}).front();
    CpuExecutor<double> exec(g);
    const Vec av = random_vec(15, rng), bv = random_vec(7, rng);
    exec.tensor(a).real = av;
    exec.tensor(b).real = bv;
    exec.run();
    double norm = 0;  // torch: the norm of the per-tensor norms
    double na = 0, nb = 0;
    for (double x : av) na += x * x;
    for (double x : bv) nb += x * x;
    norm = std::sqrt(std::pow(std::sqrt(na), 2) + std::pow(std::sqrt(nb), 2));
    const double expected = std::min(1.0, max_norm / (norm + 1e-6));
    INFO("max_norm " << max_norm << " norm " << norm);
    CHECK(exec.tensor(scale).real[0] == doctest::Approx(expected).epsilon(1e-12));
    if (max_norm < 1) CHECK(expected < 1.0);  // the clipping case really clips
    else CHECK(expected == 1.0);
    Vec want = bv;
    for (auto& x : want) x *= expected;
    CHECK(sg::test::relative_error(exec.tensor(scaled).real, want) < 1e-14);
  }
}

TEST_CASE("training steps with Adam/AdamW/Nesterov and clipping equal gradients + PyTorch's formulas") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  const auto p = sg::test::random_mlp_problem(rng);
  struct Case {
    OptimizerKind kind;
    double clip;
  };
  for (const Case c : {Case{OptimizerKind::adamw, 0.0}, Case{OptimizerKind::adam, 0.0}, Case{OptimizerKind::adamw, 0.3},
                       Case{OptimizerKind::sgd, 0.0}, Case{OptimizerKind::sgd, 0.3}}) {
    INFO("optimizer " << optimizer_name(c.kind) << " clip " << c.clip);
    OptimizerSpec spec;
    spec.lr = c.kind == OptimizerKind::sgd ? 0.05 : 0.01;
    spec.kind = c.kind;
    spec.weight_decay = 0.02;
    spec.beta1 = 0.8;
    spec.beta2 = 0.95;
    spec.eps = 1e-7;
    spec.clip_grad_norm = c.clip;
    if (c.kind == OptimizerKind::sgd) spec.momentum = 0.9, spec.nesterov = true;
    const auto stages = build_training_stages(p.spec, spec);
    CpuExecutor<double> step_exec(stages.fused);
    step_exec.set_learning_rate(spec.lr);
    CpuExecutor<double> grad_exec(stages.backward);
    sg::test::load_mlp_data(step_exec, p);
    sg::test::load_mlp_data(grad_exec, p);
    std::map<std::string, Vec> w, buf;
    std::map<std::string, TorchAdam> adam;
    for (ValueId id : stages.fused.values_with_role(Role::param)) {
      const auto& name = stages.fused.value(id).name;
      sg::test::fill_uniform(step_exec.tensor(id).real, rng);
      w[name] = step_exec.tensor(id).real;
      buf[name] = Vec(w[name].size(), 0.0);
      adam.emplace(name, TorchAdam{spec.lr, spec.beta1, spec.beta2, spec.eps, spec.weight_decay,
                                   c.kind == OptimizerKind::adamw, {}, {}});
    }
    double clipped_steps = 0;
    for (int step = 0; step < 4; ++step) {
      grad_exec.tensor(names::step).i32[0] = step;
      for (const auto& [name, values] : w) grad_exec.tensor(name).real = values;
      grad_exec.run();
      double sq = 0;
      for (const auto& [name, values] : w)
        for (double x : grad_exec.tensor("grad_" + name).real) sq += x * x;
      const double scale = c.clip > 0 ? std::min(1.0, c.clip / (std::sqrt(sq) + 1e-6)) : 1.0;
      clipped_steps += scale < 1.0;
      for (auto& [name, values] : w) {
        Vec g = grad_exec.tensor("grad_" + name).real;
        for (auto& x : g) x *= scale;
        if (c.kind != OptimizerKind::sgd) {
          adam.at(name).step(values, g);
          continue;
        }
        for (std::size_t i = 0; i < values.size(); ++i) {
          const double d_p = g[i] + spec.weight_decay * values[i];
          buf[name][i] = spec.momentum * buf[name][i] + d_p;
          values[i] -= spec.lr * (d_p + spec.momentum * buf[name][i]);
        }
      }
      step_exec.run();
      CHECK(step_exec.tensor(names::step).i32[0] == step + 1);
      for (const auto& [name, values] : w) {
        INFO("step " << step << " parameter " << name);
        CHECK(sg::test::relative_error(step_exec.tensor(name).real, values) < 1e-11);
        if (c.kind != OptimizerKind::sgd) {
          CHECK(sg::test::relative_error(step_exec.tensor("adam_m_" + name).real, adam.at(name).m) < 1e-11);
          CHECK(sg::test::relative_error(step_exec.tensor("adam_v_" + name).real, adam.at(name).v) < 1e-11);
        }
      }
    }
    if (c.clip > 0) CHECK(clipped_steps > 0);  // the clip really engaged
    CHECK(sg::test::relative_error(step_exec.tensor("w1").real, grad_exec.tensor("w1").real) > 1e-6);
  }
}

TEST_CASE("the optimizer pass: Adam's f32 moments are state, clipping leaves no fused SGD group") {
  MlpSpec mlp;
  mlp.layers = {12, 8, 4};
  mlp.batch = 4;
  mlp.dataset_rows = 16;
  OptimizerSpec adamw;
  adamw.kind = OptimizerKind::adamw;
  const Graph g = build_training_stages(mlp, adamw).fused;
  int updates = 0;
  for (const Node& n : g.nodes())
    if (n.op == OpKind::adam_update) {
      ++updates;
      CHECK(n.attr<AdamUpdateAttrs>().decoupled);
      CHECK(g.value(n.inputs[2]).role == Role::state);
      CHECK(g.value(n.inputs[2]).dtype == DType::f32);
      CHECK(g.value(n.inputs[4]).name == names::step);
    }
  CHECK(updates == 4);
  CHECK(g.find_value("adam_m_w1"));
  CHECK(g.find_value("adam_v_b2"));

  OptimizerSpec clipped;
  clipped.clip_grad_norm = 1.0;
  const Graph c = build_training_stages(mlp, clipped).fused;
  int clip_nodes = 0;
  for (const Node& n : c.nodes()) clip_nodes += n.op == OpKind::grad_clip_scale;
  CHECK(clip_nodes == 1);
  for (const auto& group : c.fusion_groups())
    CHECK((group.kind != FusionKind::wgrad_sgd && group.kind != FusionKind::bgrad_sgd));

  Graph forward = build_mlp_forward(mlp);
  const auto grads = append_backward(forward, forward.value_named(names::loss));
  CHECK_THROWS_WITH_AS(append_optimizer(forward, grads, adamw), doctest::Contains("step counter"), GraphError);
  OptimizerSpec bad_nesterov;
  bad_nesterov.nesterov = true;
  CHECK_THROWS_WITH_AS(build_training_stages(mlp, bad_nesterov), doctest::Contains("nesterov"), GraphError);
}

TEST_CASE("AdamW with clipping on the CPU: learns MNIST and resumes bit-exactly (moments and step in the checkpoint)") {
  const Dataset data{data::load_split(sg::test::mnist_dir_or_skip(), "train", 2000),
                     data::load_split(sg::test::mnist_dir_or_skip(), "t10k", 1000)};
  sg::test::MlpTrainerSpec spec;
  spec.mlp.layers = {784, 64, 10};
  spec.mlp.batch = 32;
  spec.optimizer.lr = 2e-3;
  spec.optimizer.kind = OptimizerKind::adamw;
  spec.optimizer.weight_decay = 0.01;
  spec.optimizer.clip_grad_norm = 1.0;

  const auto run = sg::test::check_cpu_resume(spec, data, 150, 70);
  bool has_moments = false;
  for (const auto& blob : run.saved) has_moments = has_moments || blob.name == "adam_v_w1";
  CHECK(has_moments);

  const EvalResult eval = run.straight->evaluate();
  MESSAGE("AdamW 784-64-10, 150 steps on 2,000 images: test accuracy " << eval.accuracy);
  CHECK(eval.accuracy > 0.80);
}
