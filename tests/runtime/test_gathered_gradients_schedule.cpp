// The CUDA cover of a rank whose weight gradients read every rank's rows
// (issue 38, graph/gathered_gradients.hpp), no GPU needed: each
// all_gather_batch is an nccl_all_gather launch on the communication stream,
// no gradient is all-reduced, the weight gradients that read gathered rows
// stay on the gradient stream (beside the data-gradient chain, waiting there
// for their gathers), and every two launches touching one value run in order
// through the three streams (tests/runtime/stream_order.hpp).
#include <doctest/doctest.h>

#include <algorithm>
#include <set>

#include "models/mlp_program.hpp"
#include "models/sequential_program.hpp"
#include "tests/runtime/report_cnn.hpp"
#include "runtime/cuda/stream_plan.hpp"
#include "tests/runtime/schedule_test_support.hpp"
#include "tests/runtime/stream_order.hpp"

using namespace sg;
using namespace sg::schedule_test;

TEST_CASE("data parallel: gathered rows are nccl_all_gather launches and their weight gradients stay beside the chain") {
  struct Case {
    OptimizerKind kind;
    double momentum;
    DType weights;
  };
  for (const Case c : {Case{OptimizerKind::sgd, 0.0, DType::f16}, Case{OptimizerKind::sgd, 0.9, DType::f16},
                       Case{OptimizerKind::adam, 0.0, DType::f16}, Case{OptimizerKind::sgd, 0.9, DType::f32}}) {
    INFO(optimizer_name(c.kind) << ", momentum " << c.momentum << ", weights " << dtype_name(c.weights));
    MlpTraining t;
    t.mlp.layers = {784, 1024, 1024, 1024, 10};
    t.mlp.batch = 256;
    t.mlp.weight_dtype = c.weights;
    t.optimizer.kind = c.kind;
    t.optimizer.momentum = c.momentum;
    t.optimizer.weight_gradients = WeightGradients::gather;
    t.data_rank = 1;
    t.data_ranks = 2;
    const TrainingProgram p = build_mlp_program(t, 60000, 10000, ProgramTarget::cuda);
    const Graph& g = p.train;
    BackendOptions options;
    const Lowered lowered = lower(g, options);
    const Schedule& s = lowered.schedule;
    const cuda::StreamPlan plan = cuda::plan_streams(g, s, options);
    test::check_stream_order(s, plan);
    options.gradient_streams = 2;
    test::check_stream_order(s, cuda::plan_streams(g, s, options));

    std::set<ValueId> gathered;
    std::size_t gathers = 0;
    for (std::size_t i = 0; i < s.launches.size(); ++i) {
      CHECK(name_of(s.launches[i]) != "nccl_all_reduce");
      for (NodeId id : s.launches[i].nodes)
        if (g.node(id).op == OpKind::all_gather_batch) {
          ++gathers;
          CHECK(name_of(s.launches[i]) == "nccl_all_gather");
          CHECK(plan.on_communication[i]);
          gathered.insert(g.node(id).outputs[0]);
        }
    }
    CHECK(gathers == 8);  // X and dY of each of the 4 layers
    // The hidden layers' weight gradients (read while the chain below them runs) are on the gradient stream.
    std::size_t beside = 0;
    for (std::size_t i = 0; i < s.launches.size(); ++i)
      if (std::any_of(s.launches[i].reads.begin(), s.launches[i].reads.end(),
                      [&](ValueId v) { return gathered.count(v) != 0; }))
        beside += plan.on_gradient_stream[i] ? 1 : 0;
    CHECK(beside >= 3);
  }
}

TEST_CASE("data parallel: auto gathers the rows of the wide layers and all-reduces the rest") {
  // 784-4096-4096-10 at batch 256 on 2 ranks: the hidden layer's rows (4.2 MB in two calls) against its 33.5 MB of
  // gradient: gathered; the first layer's 2.5 MB of rows in two calls against 6.4 MB, and the classifier's 2.1 MB
  // against 82 KB: all-reduced.
  MlpTraining t;
  t.mlp.layers = {784, 4096, 4096, 10};
  t.mlp.batch = 256;
  t.optimizer.momentum = 0.9;
  t.optimizer.weight_gradients = WeightGradients::by_bytes;
  t.data_rank = 0;
  t.data_ranks = 2;
  const TrainingProgram p = build_mlp_program(t, 60000, 10000, ProgramTarget::cuda);
  std::size_t gathers = 0, reduces = 0;
  for (const Node& n : p.train.nodes()) {
    gathers += n.op == OpKind::all_gather_batch ? 1 : 0;
    reduces += n.op == OpKind::all_reduce_mean ? 1 : 0;
  }
  CHECK(gathers == 2);
  CHECK(reduces == 2);
  const Lowered lowered = lower(p.train, BackendOptions{});
  test::check_stream_order(lowered.schedule, cuda::plan_streams(p.train, lowered.schedule, BackendOptions{}));
}

// On a GPU a CNN rank trains its channels-last variant, whose filter gradients reach their parameters through a
// to_channels_first (graph/filter_layout_pass.hpp) and whose bias gradients sum a [N*H*W, C] view of dY: a
// convolution's weight and bias are still one layer, one bucket (they were two: 5 NCCL launches for a 3-layer
// CNN). Views and layout copies are not gathered (their lowerings fold them into a neighbour's launch): with
// `gather` the convolutions (dY's view) and the first linear layer (a flatten) stay all-reduced, the classifier
// (a dropout's rows) is gathered, and every read still follows its write.
TEST_CASE("data parallel: a channels-last CNN rank buckets each layer once, views are not gathered") {
  SequentialTraining t = test::report_cnn();
  t.optimizer.momentum = 0.9;
  t.data_rank = 1;
  t.data_ranks = 2;
  for (const WeightGradients mode : {WeightGradients::reduce, WeightGradients::gather}) {
    INFO(weight_gradients_name(mode));
    t.optimizer.weight_gradients = mode;
    const TrainingProgram p = build_sequential_program(t, 1280, 200, ProgramTarget::cuda);
    REQUIRE(p.channels_last);
    const Graph& g = p.channels_last->train;
    std::size_t reduces = 0, filters = 0, gathered_filters = 0;
    for (const Node& n : g.nodes()) {
      reduces += n.op == OpKind::all_reduce_mean ? 1 : 0;
      if (n.op != OpKind::conv2d_backward_filter) continue;
      ++filters;
      bool all_gathered = true;
      for (ValueId in : n.inputs)
        all_gathered = all_gathered && g.node(g.value(in).producer).op == OpKind::all_gather_batch;
      gathered_filters += all_gathered ? 1 : 0;
    }
    CHECK(filters == 2);
    CHECK(reduces == (mode == WeightGradients::reduce ? 4u : 3u));  // two convolutions, two linear layers
    CHECK(gathered_filters == 0);
    const Lowered lowered = lower(g, BackendOptions{});
    test::check_stream_order(lowered.schedule, cuda::plan_streams(g, lowered.schedule, BackendOptions{}));
  }
}
