// RMSprop (issue 35): rmsprop_update's CPU reference against hand-computed
// two-step examples of PyTorch's torch.optim.RMSprop (plain, momentum,
// centered, weight decay, clip scale), its shape rule, the optimizer pass's
// graph (state names, placement, clip input), and a CPU training run whose
// checkpoint carries the state and resumes bit-exactly.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "graph/verifier.hpp"
#include "models/mlp.hpp"
#include "runtime/cpu/cpu_executor.hpp"
#include "runtime/data/idx_reader.hpp"
#include "runtime/trainer.hpp"
#include "tests/runtime/test_support.hpp"
#include "tests/support/test_data.hpp"
#include "tests/support/training_helpers.hpp"

using namespace sg;

namespace {

using Vec = std::vector<double>;

// One rmsprop_update node on a [2] parameter, run by the CPU executor.
struct RmspropGraph {
  Graph g;
  ValueId w, grad, square_avg, buf = -1, grad_avg = -1, scale = -1;
  RmspropGraph(const RmspropUpdateAttrs& attrs, bool with_scale) {
    w = g.param("w", {2}, DType::f32);
    grad = g.input("g", {2}, DType::f32);
    square_avg = g.state("sq", {2}, DType::f32);
    std::vector<ValueId> in{w, grad, square_avg};
    if (attrs.momentum > 0) in.push_back(buf = g.state("buf", {2}, DType::f32));
    if (attrs.centered) in.push_back(grad_avg = g.state("avg", {2}, DType::f32));
    if (with_scale) in.push_back(scale = g.input("scale", {1}, DType::f32));
    g.append_node(OpKind::rmsprop_update, in, attrs);
  }
};

// Two steps from w = [1, -0.5] with gradients [0.5, -1] then [0.25, 0.5],
// lr 0.1, alpha 0.9, eps 0.01. Returns the executor for its state.
struct TwoSteps {
  RmspropGraph graph;
  CpuExecutor<double> exec;
  TwoSteps(const RmspropUpdateAttrs& attrs, double scale = 0.0)
      : graph(attrs, scale > 0), exec(graph.g) {
    exec.set_learning_rate(0.1);
    exec.tensor(graph.w).real = {1.0, -0.5};
    for (const Vec& g : {Vec{0.5, -1.0}, Vec{0.25, 0.5}}) {
      exec.tensor(graph.grad).real = g;
      if (scale > 0) exec.tensor(graph.scale).real = {scale};
      exec.run();
    }
  }
  const Vec& w() { return exec.tensor(graph.w).real; }
  const Vec& of(ValueId v) { return exec.tensor(v).real; }
};

void check_close(const Vec& got, const Vec& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": " << got[i] << " vs " << want[i]);
    CHECK(std::abs(got[i] - want[i]) <= 1e-12 * std::max(1.0, std::abs(want[i])));
  }
}

}  // namespace

TEST_CASE("rmsprop_update's CPU reference equals hand-computed PyTorch RMSprop steps") {
  SUBCASE("plain") {
    // w[0]: sq = 0.1 * 0.5^2 = 0.025, w = 1 - 0.1 * 0.5 / (sqrt(0.025) + 0.01) = 0.702580...;
    // sq = 0.9 * 0.025 + 0.1 * 0.25^2 = 0.02875, w -= 0.1 * 0.25 / (sqrt(0.02875) + 0.01) -> 0.563351...
    TwoSteps s({0.9, 0.01, 0.0, 0.0, false});
    check_close(s.w(), {0.56335197996601094, -0.33668436772299437});
    check_close(s.of(s.graph.square_avg), {0.02875, 0.115});
  }
  SUBCASE("momentum") {
    // buf = 0.5 / 0.168114 = 2.97420...; then buf = 0.9 * buf + 0.25 / 0.179558 = 4.06906..., w -= 0.1 * buf each step.
    TwoSteps s({0.9, 0.01, 0.0, 0.9, false});
    check_close(s.w(), {0.29567628778212118, -0.060803497437554671});
    check_close(s.of(s.graph.buf), {4.0690627645800124, -1.3266220224529015});
    check_close(s.of(s.graph.square_avg), {0.02875, 0.115});
  }
  SUBCASE("centered") {
    // grad_avg = 0.05, then 0.9 * 0.05 + 0.1 * 0.25 = 0.07; avg = sqrt(sq - grad_avg^2) + eps:
    // w = 1 - 0.1 * 0.5 / (sqrt(0.0225) + 0.01) = 0.6875, then 0.6875 - 0.1 * 0.25 / (sqrt(0.02385) + 0.01).
    TwoSteps s({0.9, 0.01, 0.0, 0.0, true});
    check_close(s.w(), {0.53546373461599472, -0.32161580885885738});
    check_close(s.of(s.graph.grad_avg), {0.07, -0.04});
  }
  SUBCASE("weight decay") {
    // g = 0.5 + 0.1 * 1 = 0.6 first, then 0.25 + 0.1 * w (the updated weight).
    TwoSteps s({0.9, 0.01, 0.1, 0.0, false});
    check_close(s.w(), {0.55180883007780446, -0.32663395607269152});
    check_close(s.of(s.graph.square_avg), {0.042637468755601621, 0.12233207978023779});
  }
  SUBCASE("clip scale: the gradient scaled first (scale 2 on half the gradients is the plain run)") {
    RmspropGraph graph({0.9, 0.01, 0.0, 0.0, false}, true);
    CpuExecutor<double> exec(graph.g);
    exec.set_learning_rate(0.1);
    exec.tensor(graph.w).real = {1.0, -0.5};
    for (const Vec& g : {Vec{0.25, -0.5}, Vec{0.125, 0.25}}) {
      exec.tensor(graph.grad).real = g;
      exec.tensor(graph.scale).real = {2.0};
      exec.run();
    }
    check_close(exec.tensor(graph.w).real, {0.56335197996601094, -0.33668436772299437});
  }
}

TEST_CASE("rmsprop_update's shape rule: the attributes say which states, f32 states, alpha below 1") {
  Graph g;
  const ValueId w = g.param("w", {4, 3}, DType::f16);
  const ValueId grad = g.input("g", {4, 3}, DType::f16);
  const ValueId sq = g.state("sq", {4, 3}, DType::f32);
  const ValueId buf = g.state("buf", {4, 3}, DType::f32);
  const ValueId sq16 = g.state("sq16", {4, 3}, DType::f16);
  const ValueId scale = g.input("scale", {1}, DType::f32);
  CHECK_NOTHROW(g.append_node(OpKind::rmsprop_update, {w, grad, sq}, RmspropUpdateAttrs{}));
  CHECK(in_place_inputs(g.nodes().back()) == std::vector<int>{0, 2});
  // The states are updated in place, never the clip scale after them (every update reads it).
  CHECK_NOTHROW(g.append_node(OpKind::rmsprop_update, {w, grad, sq, buf, scale}, RmspropUpdateAttrs{0.99, 1e-8, 0, 0.9, false}));
  CHECK(in_place_inputs(g.nodes().back()) == std::vector<int>{0, 2, 3});
  CHECK_THROWS_WITH_AS(g.append_node(OpKind::rmsprop_update, {w, grad, sq16}, RmspropUpdateAttrs{}),
                       doctest::Contains("must be f32"), GraphError);
  CHECK_THROWS_AS(g.append_node(OpKind::rmsprop_update, {w, grad, sq}, RmspropUpdateAttrs{0.99, 1e-8, 0, 0.9, false}),
                  GraphError);  // momentum > 0 needs its buffer
  CHECK_THROWS_WITH_AS(g.append_node(OpKind::rmsprop_update, {w, grad, sq}, RmspropUpdateAttrs{1.0, 1e-8, 0, 0, false}),
                       doctest::Contains("alpha"), GraphError);
}

TEST_CASE("the optimizer pass: RMSprop's f32 states by role and name, after the last gradient, reading the clip scale") {
  MlpSpec mlp;
  mlp.layers = {12, 8, 4};
  mlp.batch = 4;
  mlp.dataset_rows = 16;
  OptimizerSpec rms;
  rms.kind = OptimizerKind::rmsprop;
  rms.momentum = 0.9;
  rms.centered = true;
  rms.clip_grad_norm = 1.0;
  CHECK(optimizer_from_name("rmsprop") == OptimizerKind::rmsprop);
  CHECK(optimizer_name(OptimizerKind::rmsprop) == "rmsprop");
  const Graph g = build_training_stages(mlp, rms).fused;
  NodeId last_gradient = -1, first_update = -1;
  for (const Node& n : g.nodes()) {
    if (n.op == OpKind::grad_clip_scale) last_gradient = n.id;
    if (n.op == OpKind::rmsprop_update && first_update < 0) first_update = n.id;
  }
  CHECK(first_update > last_gradient);
  int updates = 0;
  for (const Node& n : g.nodes())
    if (n.op == OpKind::rmsprop_update) {
      ++updates;
      REQUIRE(n.inputs.size() == 6);  // param, grad, square_avg, momentum_buf, grad_avg, clip scale
      const std::string param = g.value(n.inputs[0]).name;
      CHECK(g.value(n.inputs[2]).name == "rms_sq_" + param);
      CHECK(g.value(n.inputs[3]).name == "rms_buf_" + param);
      CHECK(g.value(n.inputs[4]).name == "rms_avg_" + param);
      for (int s : {2, 3, 4}) {
        CHECK(g.value(n.inputs[std::size_t(s)]).role == Role::state);
        CHECK(g.value(n.inputs[std::size_t(s)]).dtype == DType::f32);
      }
      CHECK(g.node(g.value(n.inputs[5]).producer).op == OpKind::grad_clip_scale);
    }
  CHECK(updates == 4);
  CHECK(find_graph_problems(g).empty());

  OptimizerSpec plain;
  plain.kind = OptimizerKind::rmsprop;
  const Graph p = build_training_stages(mlp, plain).fused;
  CHECK(p.find_value("rms_sq_w1"));
  CHECK_FALSE(p.find_value("rms_buf_w1"));
  CHECK_FALSE(p.find_value("rms_avg_w1"));
}

TEST_CASE("RMSprop with momentum and clipping on the CPU: learns MNIST and resumes bit-exactly (state in the checkpoint)") {
  const Dataset data{data::load_split(sg::test::mnist_dir_or_skip(), "train", 2000),
                     data::load_split(sg::test::mnist_dir_or_skip(), "t10k", 1000)};
  sg::test::MlpTrainerSpec spec;
  spec.mlp.layers = {784, 64, 10};
  spec.mlp.batch = 32;
  spec.optimizer.lr = 1e-3;
  spec.optimizer.kind = OptimizerKind::rmsprop;
  spec.optimizer.momentum = 0.5;
  spec.optimizer.centered = true;
  spec.optimizer.clip_grad_norm = 1.0;

  const auto run = sg::test::check_cpu_resume(spec, data, 150, 70);
  int states = 0;
  for (const auto& blob : run.saved)
    states += blob.name == "rms_sq_w1" || blob.name == "rms_buf_w1" || blob.name == "rms_avg_w1";
  CHECK(states == 3);

  const EvalResult eval = run.straight->evaluate();
  MESSAGE("RMSprop 784-64-10, 150 steps on 2,000 images: test accuracy " << eval.accuracy);
  CHECK(eval.accuracy > 0.80);
}
