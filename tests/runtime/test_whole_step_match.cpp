// Recognising an MLP training step for the whole-step kernel, and lowering
// it to one launch whose memory plan holds the kernel's scratch.
#include <doctest/doctest.h>

#include <algorithm>

#include "models/mlp.hpp"
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
  CHECK(g.node(plan->layers[2].weight_sgd).op == OpKind::sgd_update);
  CHECK(g.node(plan->layers[2].weight_sgd).inputs[0] == plan->layers[2].weight);
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
