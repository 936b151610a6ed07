// Recognising an MLP training step for the whole-step kernel, and lowering
// it to one launch whose memory plan holds the kernel's scratch.
#include <doctest/doctest.h>

#include <algorithm>

#include "models/mlp.hpp"
#include "models/sequential.hpp"
#include "runtime/plan/memory_plan.hpp"
#include "runtime/plan/schedule.hpp"
#include "runtime/plan/mlp_step_pattern.hpp"

using namespace sg;

namespace {

MlpSpec reference_spec() {
  MlpSpec spec;
  spec.layers = {784, 128, 128, 128, 10};
  spec.batch = 32;
  return spec;
}

}  // namespace

TEST_CASE("the fused reference training step is recognised, with every layer's values") {
  const Graph g = build_training_stages(reference_spec(), {0.003, 0.0, 0.0}).fused;
  const auto plan = match_whole_step(g);
  REQUIRE(plan);
  CHECK(plan->dims == std::vector<std::int64_t>{784, 128, 128, 128, 10});
  CHECK(plan->batch == 32);
  CHECK(plan->input_scale == doctest::Approx(1.0 / 255.0));
  REQUIRE(plan->layers.size() == 4);
  CHECK(g.value(plan->layers[0].weight).name == "w1");
  CHECK(g.value(plan->layers[3].bias).name == "b4");
  CHECK(g.node(plan->layers[2].weight_update).op == OpKind::sgd_update);
  CHECK(g.node(plan->layers[2].weight_update).inputs[0] == plan->layers[2].weight);
  CHECK(g.value(plan->layers[3].output).shape == Shape{32, 10});   // logits
  CHECK(plan->layers[3].pre_activation_grad == -1);
  CHECK(g.value(plan->layers[0].output).shape == Shape{32, 128});  // relu output
  CHECK(g.node(g.value(plan->layers[0].pre_activation_grad).producer).op == OpKind::relu_backward);
  CHECK(g.value(plan->loss).name == "loss");
}

TEST_CASE("graphs that are not exactly a plain MLP training step are not recognised") {
  const auto stages = build_training_stages(reference_spec(), {0.003, 0.0, 0.0});
  CHECK_FALSE(match_whole_step(stages.forward));
  CHECK_FALSE(match_whole_step(stages.optimized));  // unfused
  CHECK_FALSE(match_whole_step(build_mlp_eval(reference_spec())));
  Graph partly_fused = build_training_stages(reference_spec(), {0.003, 0.0, 0.0}, {true, false, true, true}).fused;
  CHECK_FALSE(match_whole_step(partly_fused));
  // One extra node the kernel would silently drop.
  Graph extra = stages.fused;
  extra.mark_output(extra.value_named("relu"));
  CHECK_FALSE(match_whole_step(extra));
  // Momentum is still the step's pattern (whether a kernel runs it is the backend's question).
  CHECK(match_whole_step(build_training_stages(reference_spec(), {0.003, 0.9, 0.0}).fused));
  MlpSpec master = reference_spec();
  master.weight_dtype = DType::f32;  // casts between master weights and matmuls
  CHECK_FALSE(match_whole_step(build_training_stages(master, {0.003, 0.0, 0.0}).fused));
}

namespace {

struct ActivationCase {
  MlpActivation activation;
  OpKind forward, backward;
  bool backward_reads_pre_activation;  // gelu, gelu_tanh, silu
};
const ActivationCase kActivationCases[] = {
    {MlpActivation::relu, OpKind::relu, OpKind::relu_backward, false},
    {MlpActivation::gelu, OpKind::gelu, OpKind::gelu_backward, true},
    {MlpActivation::gelu_tanh, OpKind::gelu_tanh, OpKind::gelu_tanh_backward, true},
    {MlpActivation::silu, OpKind::silu, OpKind::silu_backward, true},
    {MlpActivation::tanh, OpKind::tanh, OpKind::tanh_backward, false},
    {MlpActivation::sigmoid, OpKind::sigmoid, OpKind::sigmoid_backward, false}};

MlpSpec spec_with(MlpActivation activation) {
  MlpSpec spec = reference_spec();
  spec.activation = activation;
  return spec;
}

// An MLP as a Sequential layer list (linear, then `between` after each hidden linear).
SequentialSpec sequential_mlp(const std::vector<std::vector<MlpActivation>>& between) {
  SequentialSpec spec;
  spec.input_shape = {784};
  spec.batch = 32;
  for (const auto& acts : between) {
    spec.layers.push_back({LayerKind::linear, 128});
    for (MlpActivation a : acts) spec.layers.push_back({.kind = LayerKind::activation, .activation = a});
  }
  spec.layers.push_back({LayerKind::linear, 10});
  return spec;
}

}  // namespace

TEST_CASE("every hidden-layer activation is recognised, with the value its backward reads") {
  for (const ActivationCase& c : kActivationCases) {
    INFO("activation " << activation_name(c.activation));
    const Graph g = build_training_stages(spec_with(c.activation), {0.003, 0.0, 0.0}).fused;
    const auto plan = match_whole_step(g);
    REQUIRE(plan);
    CHECK(plan->activation == c.forward);
    CHECK(plan->backward_reads_pre_activation == c.backward_reads_pre_activation);
    CHECK(plan->dims == std::vector<std::int64_t>{784, 128, 128, 128, 10});
    REQUIRE(plan->layers.size() == 4);
    CHECK(plan->layers[3].pre_activation == -1);  // the logits layer
    for (std::size_t l = 0; l < 3; ++l) {
      INFO("hidden layer " << l);
      const WholeStepLayer& layer = plan->layers[l];
      CHECK(g.node(g.value(layer.pre_activation).producer).op == OpKind::bias_add);
      const Node& act = g.node(g.value(layer.output).producer);
      CHECK(act.op == c.forward);
      CHECK(act.inputs[0] == layer.pre_activation);
      const Node& bw = g.node(g.value(layer.pre_activation_grad).producer);
      CHECK(bw.op == c.backward);
      CHECK(bw.inputs[1] == (c.backward_reads_pre_activation ? layer.pre_activation : layer.output));
    }
  }
  // No hidden layer: nothing to activate, the ReLU instance's plan.
  MlpSpec logistic = spec_with(MlpActivation::gelu);
  logistic.layers = {784, 10};
  const auto plan = match_whole_step(build_training_stages(logistic, {0.003, 0.0, 0.0}).fused);
  REQUIRE(plan);
  CHECK(plan->activation == OpKind::relu);
  CHECK_FALSE(plan->backward_reads_pre_activation);
  // The Sequential form of the same MLP is the same graph.
  const auto seq = match_whole_step(build_sequential_training_stages(
                                        sequential_mlp({{MlpActivation::silu}, {MlpActivation::silu}}), {0.003, 0.0, 0.0})
                                        .fused);
  REQUIRE(seq);
  CHECK(seq->activation == OpKind::silu);
}

TEST_CASE("steps the whole-step kernels do not compute are not recognised, whatever the activation") {
  for (const ActivationCase& c : kActivationCases) {
    INFO("activation " << activation_name(c.activation));
    const MlpSpec base = spec_with(c.activation);
    const OptimizerSpec sgd{0.003, 0.0, 0.0};
    const auto stages = build_training_stages(base, sgd);
    CHECK_FALSE(match_whole_step(stages.forward));
    CHECK_FALSE(match_whole_step(stages.optimized));  // unfused
    CHECK_FALSE(match_whole_step(build_training_stages(base, sgd, {true, false, true, true}).fused));
    // An extra output: the pre-activation or the activation itself.
    Graph extra = stages.fused;
    const auto plan = match_whole_step(extra);
    REQUIRE(plan);
    extra.mark_output(plan->layers[1].pre_activation);
    CHECK_FALSE(match_whole_step(extra));
    Graph extra_act = stages.fused;
    extra_act.mark_output(plan->layers[0].output);
    CHECK_FALSE(match_whole_step(extra_act));
    // Dropout between the layers, label smoothing, a regression loss, fp32 master weights.
    MlpSpec dropout = base;
    dropout.dropout = 0.1;
    CHECK_FALSE(match_whole_step(build_training_stages(dropout, sgd).fused));
    MlpSpec smoothed = base;
    smoothed.label_smoothing = 0.1;
    CHECK_FALSE(match_whole_step(build_training_stages(smoothed, sgd).fused));
    MlpSpec mse = base;
    mse.loss = MlpLoss::mse;
    mse.feature_dtype = DType::f32;
    mse.target_width = 3;
    mse.layers.back() = 3;
    CHECK_FALSE(match_whole_step(build_training_stages(mse, sgd).fused));
    MlpSpec master = base;
    master.weight_dtype = DType::f32;
    CHECK_FALSE(match_whole_step(build_training_stages(master, sgd).fused));
    // Any optimizer is the step's pattern (issue 35): its update nodes are
    // the optimizer's, lone after the last gradient (the kernels hand their
    // gradients to the update stage's launch).
    for (const auto& [kind, op] : {std::pair{OptimizerKind::adamw, OpKind::adam_update},
                                   std::pair{OptimizerKind::rmsprop, OpKind::rmsprop_update}}) {
      OptimizerSpec rule = sgd;
      rule.kind = kind;
      const Graph g = build_training_stages(base, rule).fused;
      const auto found = match_whole_step(g);
      REQUIRE(found);
      for (const WholeStepLayer& layer : found->layers) {
        CHECK(g.node(layer.weight_update).op == op);
        CHECK(g.node(layer.bias_update).inputs[0] == layer.bias);
        CHECK(g.node(layer.weight_update).fusion_group < 0);
      }
      rule.clip_grad_norm = 1.0;  // the clip scale's nodes read every gradient: not the kernels' step
      CHECK_FALSE(match_whole_step(build_training_stages(base, rule).fused));
    }
  }
  // No activation (identity): not a kernel's activation.
  CHECK_FALSE(match_whole_step(build_training_stages(spec_with(MlpActivation::identity), {0.003, 0.0, 0.0}).fused));
  // Different activations in different layers, and two activations in a row: one instance computes one.
  const OptimizerSpec sgd{0.003, 0.0, 0.0};
  CHECK_FALSE(match_whole_step(
      build_sequential_training_stages(sequential_mlp({{MlpActivation::gelu}, {MlpActivation::tanh}}), sgd).fused));
  CHECK_FALSE(match_whole_step(
      build_sequential_training_stages(sequential_mlp({{MlpActivation::relu}, {MlpActivation::silu}}), sgd).fused));
  CHECK_FALSE(match_whole_step(
      build_sequential_training_stages(sequential_mlp({{MlpActivation::relu, MlpActivation::tanh}}), sgd).fused));
  CHECK_FALSE(match_whole_step(
      build_sequential_training_stages(sequential_mlp({{MlpActivation::tanh, MlpActivation::tanh}}), sgd).fused));
}

namespace {

// Takes the whole graph as one launch with the plan's scratch, as the CUDA
// whole-step lowerings do (they also ask the device, which this test has not).
class WholeGraph final : public Lowering {
 public:
  std::string_view name() const override { return "whole_graph"; }
  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    const auto plan = match_whole_step(cover.graph());
    if (!plan || unit.id != 0) return std::nullopt;
    Match m;
    for (const CoverUnit& u : cover.units()) m.units.push_back(u.id);
    m.graph_order = true;
    for (const WholeStepLayer& layer : plan->layers)
      if (layer.pre_activation_grad >= 0) {
        m.scratch.push_back(layer.output);
        m.scratch.push_back(layer.pre_activation_grad);
        if (plan->backward_reads_pre_activation) m.scratch.push_back(layer.pre_activation);
      }
    return m;
  }
};

}  // namespace

TEST_CASE("a recognised step lowers to one launch whose scratch gets arena slots") {
  const Graph g = build_training_stages(reference_spec(), {0.003, 0.0, 0.0}).fused;
  const WholeGraph whole;
  const Schedule s = build_schedule(g, {&whole});
  REQUIRE(s.launches.size() == 1);
  const Launch& l = s.launches[0];
  CHECK(l.nodes.size() == g.nodes().size());
  CHECK(std::is_sorted(l.nodes.begin(), l.nodes.end()));
  CHECK(l.writes == std::vector<ValueId>{g.value_named("loss")});
  CHECK(l.updates.size() == 9);  // 8 parameters and the step counter
  CHECK(l.scratch.size() == 6);  // 3 relu outputs, 3 pre-activation gradients (the logits stay on chip)
  std::vector<std::size_t> bytes;
  for (const auto& v : g.values()) bytes.push_back(static_cast<std::size_t>(element_count(v.shape)) * dtype_size(v.dtype));
  const auto req = arena_request(g, s, bytes, {});
  for (ValueId id : l.scratch) CHECK(req.buffer_of_value[static_cast<std::size_t>(id)] >= 0);
  const MemoryPlan mp = plan_memory(req.buffers);
  CHECK(mp.arena_bytes >= 6 * 32 * 128 * 2);  // all live at once: no sharing
  CHECK(dump_schedule(g, s).find("whole_graph[scratch {relu,") != std::string::npos);
}

TEST_CASE("where the backward reads the pre-activation, the one launch also keeps it as scratch") {
  for (const ActivationCase& c : kActivationCases) {
    INFO("activation " << activation_name(c.activation));
    const Graph g = build_training_stages(spec_with(c.activation), {0.003, 0.0, 0.0}).fused;
    const WholeGraph whole;
    const Schedule s = build_schedule(g, {&whole});
    REQUIRE(s.launches.size() == 1);
    const Launch& l = s.launches[0];
    CHECK(l.nodes.size() == g.nodes().size());
    CHECK(l.writes == std::vector<ValueId>{g.value_named("loss")});
    // 3 activation outputs, 3 pre-activation gradients [, 3 pre-activations]
    CHECK(l.scratch.size() == (c.backward_reads_pre_activation ? 9u : 6u));
    std::vector<std::size_t> bytes;
    for (const auto& v : g.values()) bytes.push_back(static_cast<std::size_t>(element_count(v.shape)) * dtype_size(v.dtype));
    const auto req = arena_request(g, s, bytes, {});
    for (ValueId id : l.scratch) CHECK(req.buffer_of_value[static_cast<std::size_t>(id)] >= 0);
    const MemoryPlan mp = plan_memory(req.buffers);
    CHECK(mp.arena_bytes >= l.scratch.size() * 32 * 128 * 2);  // all live at once: no sharing
  }
}
