// Recognising an MLP training step for the whole-step kernel, and lowering
// it to one launch whose memory plan holds the kernel's scratch.
#include <doctest/doctest.h>

#include "graph/training_graph.hpp"
#include "runtime/plan/memory_plan.hpp"
#include "runtime/plan/schedule.hpp"
#include "runtime/plan/whole_step_match.hpp"

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
  // A schedule's new learning rate (the same for every parameter) is still a plain step.
  Graph new_rate = stages.fused;
  new_rate.set_sgd_learning_rate(0.5);
  CHECK(match_whole_step(new_rate));
  MlpSpec master = reference_spec();
  master.weight_dtype = DType::f32;  // casts between master weights and matmuls
  CHECK_FALSE(match_whole_step(build_training_stages(master, {0.003, 0.0, 0.0}).fused));
}

TEST_CASE("a recognised step lowers to one launch whose scratch gets arena slots") {
  const Graph g = build_training_stages(reference_spec(), {0.003, 0.0, 0.0}).fused;
  const auto plan = match_whole_step(g);
  REQUIRE(plan);
  const Schedule s = build_whole_step_schedule(g, *plan);
  REQUIRE(s.launches.size() == 1);
  const Launch& l = s.launches[0];
  CHECK(l.kind == LaunchKind::whole_step);
  CHECK(l.nodes.size() == g.nodes().size());
  CHECK(l.writes == std::vector<ValueId>{g.value_named("loss")});
  CHECK(l.updates.size() == 9);  // 8 parameters and the step counter
  CHECK(l.scratch.size() == 6);  // 3 relu outputs, 3 pre-activation gradients (the logits stay on chip)
  std::vector<std::size_t> bytes;
  for (const auto& v : g.values()) bytes.push_back(static_cast<std::size_t>(element_count(v.shape)) * dtype_size(v.dtype));
  const auto req = arena_request(g, s, bytes, {});
  for (ValueId id : l.scratch) CHECK(req.buffer_of_value[static_cast<std::size_t>(id)] >= 0);
  const MemoryPlan mp = plan_memory(req.buffers);
  CHECK(mp.arena_bytes >= 6 * 32 * 128 * 2);  // all live at once: no sharing
  CHECK(dump_schedule(g, s).find("whole_step[dims=784-128-128-128-10,batch=32") != std::string::npos);
}
