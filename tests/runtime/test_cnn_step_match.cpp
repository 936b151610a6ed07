// Recognising a small sequential CNN's training step for the CUDA cnn_step
// kernels (runtime/plan/cnn_step_pattern.hpp), and refusing every graph they
// would compute differently.
#include <doctest/doctest.h>

#include "runtime/plan/cnn_step_pattern.hpp"
#include "tests/runtime/report_cnn.hpp"

using namespace sg;

using test::cnn_layer;
using test::report_cnn;
using test::report_cnn_cuda_graph;

TEST_CASE("the report CNN's fused CUDA training step is recognised, layer by layer") {
  const Graph g = report_cnn_cuda_graph(report_cnn());
  const CnnStepMatch found = match_cnn_step(g);
  INFO(found.why_not);
  REQUIRE(found.plan);
  const CnnStepPlan& plan = *found.plan;
  CHECK(plan.batch == 64);
  CHECK(g.value(plan.loss).name == "loss");
  using K = CnnStepLayerKind;
  // reshape of the fetched rows, then the 12 listed layers.
  const std::vector<K> kinds{K::view,   K::conv2d,     K::max_pool2d, K::relu, K::conv2d, K::dropout2d, K::max_pool2d,
                             K::relu,   K::view,       K::linear,     K::relu, K::dropout, K::linear};
  REQUIRE(plan.layers.size() == kinds.size());
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    CAPTURE(i);
    CHECK(plan.layers[i].kind == kinds[i]);
  }
  CHECK(g.value(plan.layers[1].weight).name == "w1");
  CHECK(g.value(plan.layers[1].weight).dtype == DType::f32);  // the master copy, not its fp16 cast
  CHECK(g.value(plan.layers[12].bias).name == "b4");
  CHECK(g.node(plan.layers[4].weight_sgd).op == OpKind::sgd_update);
  CHECK(g.node(plan.layers[4].weight_sgd).inputs[0] == plan.layers[4].weight);
  CHECK(g.node(plan.layers[4].bias_sgd).inputs[0] == plan.layers[4].bias);
  // Only the first conv skips its input gradient (its input is the image).
  CHECK_FALSE(plan.layers[1].input_gradient);
  CHECK(plan.layers[4].input_gradient);
  CHECK(plan.layers[12].input_gradient);
  CHECK(plan.layers[5].dropout.p == doctest::Approx(0.5));
  CHECK(g.value(plan.layers[6].output).shape == Shape{64, 20, 4, 4});
  CHECK(plan.logits == plan.layers[12].output);
}

TEST_CASE("graphs the CNN step kernels would compute differently are not recognised") {
  SUBCASE("fp32 compute (no casts: the parameters are the operands)") {
    auto t = report_cnn();
    t.model.compute_dtype = DType::f32;
    CHECK_FALSE(match_cnn_step(build_sequential_program(t, 1280, 200, ProgramTarget::cpu).train).plan);
  }
  SUBCASE("the eval graph") {
    CHECK_FALSE(match_cnn_step(build_sequential_program(report_cnn(), 1280, 200, ProgramTarget::cuda).eval).plan);
  }
  SUBCASE("fp16 weights without master copies") {
    auto t = report_cnn();
    t.model.weight_dtype = DType::f16;
    CHECK(match_cnn_step(report_cnn_cuda_graph(t)).why_not.find("master") != std::string::npos);
  }
  SUBCASE("AdamW") {
    auto t = report_cnn();
    t.optimizer.kind = OptimizerKind::adamw;
    CHECK_FALSE(match_cnn_step(report_cnn_cuda_graph(t)).plan);
  }
  SUBCASE("Nesterov momentum") {
    auto t = report_cnn();
    t.optimizer.nesterov = true;
    CHECK_FALSE(match_cnn_step(report_cnn_cuda_graph(t)).plan);
  }
  SUBCASE("gradient clipping") {
    auto t = report_cnn();
    t.optimizer.clip_grad_norm = 1.0;
    CHECK_FALSE(match_cnn_step(report_cnn_cuda_graph(t)).plan);
  }
  SUBCASE("a GELU activation") {
    auto t = report_cnn();
    t.model.layers[2].activation = MlpActivation::gelu;
    CHECK_FALSE(match_cnn_step(report_cnn_cuda_graph(t)).plan);
  }
  SUBCASE("an MLP (it has its own kernels)") {
    auto t = report_cnn();
    t.model.input_shape = {784};
    t.model.layers = {cnn_layer(LayerKind::linear, 50), cnn_layer(LayerKind::activation), cnn_layer(LayerKind::linear, 10)};
    CHECK(match_cnn_step(report_cnn_cuda_graph(t)).why_not == "no conv2d layer");
  }
  SUBCASE("an extra output") {
    Graph g = report_cnn_cuda_graph(report_cnn());
    g.mark_output(g.value_named("relu"));
    CHECK_FALSE(match_cnn_step(g).plan);
  }
}
