// Recognising a small sequential CNN's training step for the CUDA cnn_step
// kernels (runtime/plan/cnn_step_pattern.hpp) under any optimizer, and
// refusing every graph they would compute differently (which optimizer
// updates the kernels apply is the lowering's check: test_cnn_step_layout).
#include <doctest/doctest.h>

#include <algorithm>
#include <tuple>

#include "runtime/plan/cnn_step_pattern.hpp"
#include "tests/runtime/report_cnn.hpp"

using namespace sg;

using test::net_layer;
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
  CHECK(g.node(plan.layers[4].weight_update).op == OpKind::sgd_update);
  CHECK(g.node(plan.layers[4].weight_update).inputs[0] == plan.layers[4].weight);
  CHECK(g.node(plan.layers[4].bias_update).inputs[0] == plan.layers[4].bias);
  // Only the first conv skips its input gradient (its input is the image).
  CHECK_FALSE(plan.layers[1].input_gradient);
  CHECK(plan.layers[4].input_gradient);
  CHECK(plan.layers[12].input_gradient);
  CHECK(plan.layers[5].dropout.p == doctest::Approx(0.5));
  CHECK(g.value(plan.layers[6].output).shape == Shape{64, 20, 4, 4});
  CHECK(plan.logits == plan.layers[12].output);
}

TEST_CASE("the CNN step is recognised under every optimizer: its update nodes are the optimizer's") {
  for (const auto& [kind, op] : {std::pair{OptimizerKind::adamw, OpKind::adam_update},
                                std::pair{OptimizerKind::adam, OpKind::adam_update},
                                std::pair{OptimizerKind::rmsprop, OpKind::rmsprop_update},
                                std::pair{OptimizerKind::sgd, OpKind::sgd_update}}) {
    auto t = report_cnn();
    t.optimizer.kind = kind;
    t.optimizer.nesterov = kind == OptimizerKind::sgd;  // structural: the lowering declines Nesterov
    t.optimizer.momentum = kind == OptimizerKind::sgd ? 0.9 : 0.0;
    CAPTURE(optimizer_name(kind));
    const Graph g = report_cnn_cuda_graph(t);
    const CnnStepMatch found = match_cnn_step(g);
    INFO(found.why_not);
    REQUIRE(found.plan);
    int updates = 0;
    for (const CnnStepLayer& l : found.plan->layers) {
      if (l.weight < 0) continue;
      for (const auto& [param, update] : {std::pair{l.weight, l.weight_update}, std::pair{l.bias, l.bias_update}}) {
        CHECK(g.node(update).op == op);
        CHECK(g.node(update).inputs[0] == param);
        ++updates;
      }
    }
    CHECK(updates == 8);
  }
}

TEST_CASE("every activation is recognised: its backward node reads the forward's input or output") {
  for (const auto& [activation, op] :
       {std::pair{MlpActivation::gelu, OpKind::gelu}, std::pair{MlpActivation::gelu_tanh, OpKind::gelu_tanh},
        std::pair{MlpActivation::silu, OpKind::silu}, std::pair{MlpActivation::tanh, OpKind::tanh},
        std::pair{MlpActivation::sigmoid, OpKind::sigmoid}}) {
    auto t = report_cnn();
    t.model.layers[2].activation = activation;  // after the first pooling
    t.model.layers[9].activation = activation;  // after the hidden linear layer
    CAPTURE(op_name(op));
    const Graph g = report_cnn_cuda_graph(t);
    const CnnStepMatch found = match_cnn_step(g);
    INFO(found.why_not);
    REQUIRE(found.plan);
    for (const std::size_t i : {std::size_t{3}, std::size_t{10}}) {
      CAPTURE(i);
      CHECK(found.plan->layers[i].kind == CnnStepLayerKind::activation);
      CHECK(found.plan->layers[i].activation == op);
    }
    CHECK(found.plan->layers[7].kind == CnnStepLayerKind::relu);  // the other ReLU stays one
  }
}

TEST_CASE("a data-parallel rank's CNN step is recognised: its slice of the batch, every gradient all-reduced") {
  for (const auto& [kind, bucket_bytes] : {std::pair{OptimizerKind::sgd, std::int64_t{0}}, {OptimizerKind::adamw, 0},
                                           {OptimizerKind::sgd, std::int64_t{1} << 30}}) {  // one joined bucket
    CAPTURE(optimizer_name(kind));
    CAPTURE(bucket_bytes);
    auto t = report_cnn();
    t.optimizer.kind = kind;
    t.optimizer.bucket_bytes = bucket_bytes;
    t.data_rank = 2;
    t.data_ranks = 3;
    const Graph g = report_cnn_cuda_graph(t);
    const CnnStepMatch found = match_cnn_step(g);
    INFO(found.why_not);
    REQUIRE(found.plan);
    const CnnStepPlan& plan = *found.plan;
    CHECK(plan.rank == 2);
    CHECK(plan.ranks == 3);
    CHECK(plan.gradients_reduced);
    int tensors = 0;
    for (const CnnStepLayer& l : plan.layers) {
      if (l.weight < 0) continue;
      for (const auto& [param, gradient, update] : {std::tuple{l.weight, l.weight_gradient, l.weight_update},
                                                   std::tuple{l.bias, l.bias_gradient, l.bias_update}}) {
        ++tensors;
        // The kernel's gradient is the fp32 cast an all_reduce_mean reads; the update reads its output.
        CHECK(g.value(gradient).dtype == DType::f32);
        REQUIRE(g.consumers(gradient).size() == 1);
        const Node& all_reduce = g.node(g.consumers(gradient)[0]);
        CHECK(all_reduce.op == OpKind::all_reduce_mean);
        const auto k = std::find(all_reduce.inputs.begin(), all_reduce.inputs.end(), gradient) - all_reduce.inputs.begin();
        CHECK(g.node(update).inputs[1] == all_reduce.outputs[std::size_t(k)]);
        CHECK(g.node(update).inputs[0] == param);
      }
    }
    CHECK(tensors == 8);
  }
  // A single-process step has no reduction; its gradients are the update's inputs.
  const Graph single = report_cnn_cuda_graph(report_cnn());
  const auto plan = match_cnn_step(single).plan;
  REQUIRE(plan);
  CHECK_FALSE(plan->gradients_reduced);
  CHECK(plan->ranks == 1);
  CHECK(single.node(plan->layers[1].weight_update).inputs[1] == plan->layers[1].weight_gradient);
  // Clipping the reduced gradients adds nodes the kernels do not compute.
  auto clipped = report_cnn();
  clipped.data_ranks = 2;
  clipped.optimizer.clip_grad_norm = 1.0;
  CHECK_FALSE(match_cnn_step(report_cnn_cuda_graph(clipped)).plan);
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
  SUBCASE("gradient clipping (SGD and AdamW)") {
    for (const OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::adamw}) {
      auto t = report_cnn();
      t.optimizer.kind = kind;
      t.optimizer.clip_grad_norm = 1.0;
      CHECK_FALSE(match_cnn_step(report_cnn_cuda_graph(t)).plan);
    }
  }
  SUBCASE("an MLP (it has its own kernels)") {
    auto t = report_cnn();
    t.model.input_shape = {784};
    t.model.layers = {net_layer(LayerKind::linear, 50), net_layer(LayerKind::activation), net_layer(LayerKind::linear, 10)};
    CHECK(match_cnn_step(report_cnn_cuda_graph(t)).why_not == "no conv2d layer");
  }
  SUBCASE("an extra output") {
    Graph g = report_cnn_cuda_graph(report_cnn());
    g.mark_output(g.value_named("relu"));
    CHECK_FALSE(match_cnn_step(g).plan);
  }
}
