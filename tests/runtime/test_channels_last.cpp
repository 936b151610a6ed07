// Channels-last convolution layers (graph/channels_last_pass.hpp) on the CPU
// reference: the rewritten forward's structure (which ops turned
// channels-last, where conversions sit and which of them copy), and the
// training steps of the rewritten graph against the original's in f64, SGD
// with momentum and AdamW, from the same parameters on the same batches:
// only the order of the activations' elements differs, so the parameters
// after every step agree to rounding.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "graph/channels_last_pass.hpp"
#include "graph/training_graph.hpp"
#include "models/mlp_program.hpp"
#include "models/sequential.hpp"
#include "models/sequential_program.hpp"
#include "runtime/cpu/cpu_executor.hpp"
#include "tests/runtime/channels_last_networks.hpp"
#include "tests/runtime/sequential_cpu_steps.hpp"
#include "tests/runtime/small_residual_cnn.hpp"
#include "tests/runtime/test_support.hpp"

using namespace sg;
using sg::test::net_layer;

namespace {

using test::activation_layer;

// Three input channels (the entry conversion copies), a stride-2 conv,
// overlapping poolings (3x3 at stride 2, 2x2 at stride 1), GELU, then a
// flatten of 5 x 2 x 2: one region from the input to the flatten.
SequentialSpec three_channel_cnn(std::int64_t batch) {
  SequentialSpec s;
  s.input_shape = {3, 11, 11};
  s.layers = {net_layer(LayerKind::conv2d, 6, 3, 1),
              activation_layer(MlpActivation::relu),
              net_layer(LayerKind::max_pool2d, 0, 3, 0, 2),
              net_layer(LayerKind::conv2d, 5, 3, 1, 2),
              activation_layer(MlpActivation::gelu),
              net_layer(LayerKind::max_pool2d, 0, 2, 0, 1),
              net_layer(LayerKind::flatten),
              net_layer(LayerKind::linear, 4)};
  s.batch = batch;
  s.dataset_rows = 40;
  s.weight_dtype = DType::f32;
  s.compute_dtype = DType::f32;
  return s;
}

// One channel in (a view), a residual add inside the region: the layers of
// the data-parallel tests' small residual CNN.
SequentialSpec residual_cnn(std::int64_t batch) {
  SequentialSpec s = three_channel_cnn(batch);
  const SequentialSpec residual = test::small_residual_cnn(batch, OptimizerKind::sgd).model;
  s.input_shape = residual.input_shape;
  s.layers = residual.layers;
  return s;
}

// `s` with a dropout layer (`kind`, probability p) inserted before layer `at`.
SequentialSpec with_dropout_at(SequentialSpec s, std::size_t at, LayerKind kind, double p) {
  LayerSpec drop = net_layer(kind);
  drop.p = p;
  s.layers.insert(s.layers.begin() + static_cast<std::ptrdiff_t>(at), drop);
  return s;
}

// The three-channel CNN with a dropout between its last pooling (5 x 2 x 2)
// and the flatten: the region's exit, a copy, moves before the dropout.
SequentialSpec dropout_before_flatten_cnn(std::int64_t batch) {
  return with_dropout_at(three_channel_cnn(batch), 6, LayerKind::dropout, 0.3);
}

// The three-channel CNN with a dropout2d after its first pooling and an
// overlapping 3x3 mean pooling at stride 2 after its second convolution:
// both stay inside the region. A dropout before the flatten reads the
// region's one exit (its bit keyed on the NCHW index).
SequentialSpec dropout_mean_pool_cnn(std::int64_t batch) {
  SequentialSpec s = with_dropout_at(three_channel_cnn(batch), 3, LayerKind::dropout2d, 0.4);
  s.layers[6] = net_layer(LayerKind::avg_pool2d, 0, 3, 0, 2);  // was the 2x2 max pooling at stride 1
  return with_dropout_at(std::move(s), 7, LayerKind::dropout, 0.3);  // between the mean pooling and the flatten
}

// issue 37's residual block with batch normalisation (configs/mnist_resnet.yaml
// in small, on 2-channel images: the entry conversion copies).
SequentialSpec batch_norm_cnn(std::int64_t batch) {
  SequentialSpec s = three_channel_cnn(batch);
  s.input_shape = {2, 8, 8};
  s.layers = test::batch_norm_residual_layers(4);
  return s;
}

int count(const Graph& g, OpKind op) {
  return static_cast<int>(std::count_if(g.nodes().begin(), g.nodes().end(), [&](const Node& n) { return n.op == op; }));
}

// Runs `steps` training steps of the forward graph `forward` (f64) from the
// spec's initial parameters on random u8 images; returns every parameter.
std::vector<double> train(Graph forward, const SequentialSpec& spec, const OptimizerSpec& optimizer, int steps,
                          std::uint64_t data_seed) {
  const Graph g = test::sequential_training_stages(std::move(forward), optimizer).fused;
  return test::sequential_cpu_steps(g, spec, optimizer.lr, steps, data_seed);
}

}  // namespace

TEST_CASE("channels-last rewrite: convs, poolings and element-wise ops between them turn, conversions at the edges") {
  const auto rewritten = rewrite_channels_last(build_sequential_forward(three_channel_cnn(4)));
  REQUIRE(rewritten);
  const Graph& g = rewritten->graph;
  CHECK(rewritten->convolutions == 2);
  CHECK(rewritten->copies == 2);  // the 3-channel input in, the last pooling out to the flatten
  CHECK(rewritten->inner_exits == 0);
  CHECK(count(g, OpKind::to_channels_last) == 1);
  CHECK(count(g, OpKind::to_channels_first) == 1);
  for (const Node& n : g.nodes()) {
    if (n.op == OpKind::conv2d) CHECK(n.attr<Conv2dAttrs>().channels_last);
    if (n.op == OpKind::max_pool2d) CHECK(n.attr<Pool2dAttrs>().channels_last);
    if (n.op == OpKind::flatten) CHECK(g.node(g.value(n.inputs[0]).producer).op == OpKind::to_channels_first);
  }
  // Parameters keep their shapes and names.
  const Graph original = build_sequential_forward(three_channel_cnn(4));
  for (ValueId p : original.values_with_role(Role::param))
    CHECK(g.value(g.value_named(original.value(p).name)).shape == original.value(p).shape);
  CHECK(g.value(g.value_named(names::loss)).shape == original.value(original.value_named(names::loss)).shape);

  // One input channel: the conversion in is a view; the residual add stays channels-last.
  const auto residual = rewrite_channels_last(build_sequential_forward(residual_cnn(4)));
  REQUIRE(residual);
  CHECK(residual->copies == 1);
  CHECK(residual->inner_exits == 0);
  CHECK(count(residual->graph, OpKind::to_channels_first) == 1);

  // batch_norm turns with its input (BatchNorm1d over the [N*H*W, C] rows);
  // the global average pooling reads the last stage back channels-first.
  const auto normalised = rewrite_channels_last(build_sequential_forward(batch_norm_cnn(4)));
  REQUIRE(normalised);
  CHECK(normalised->convolutions == 4);
  CHECK(normalised->copies == 2);  // the 2-channel input in, the last stage out to the pooling
  CHECK(normalised->inner_exits == 0);
  CHECK(count(normalised->graph, OpKind::batch_norm) == 4);
  for (const Node& n : normalised->graph.nodes()) {
    if (n.op == OpKind::batch_norm || n.op == OpKind::batch_norm_stats_update)
      CHECK(n.attr<BatchNormAttrs>().channels_last);
    if (n.op == OpKind::global_avg_pool2d)
      CHECK(normalised->graph.node(normalised->graph.value(n.inputs[0]).producer).op == OpKind::to_channels_first);
  }
  const auto eval = rewrite_channels_last(build_sequential_eval(batch_norm_cnn(4)));
  REQUIRE(eval);
  for (const Node& n : eval->graph.nodes())
    if (n.op == OpKind::batch_norm_inference) CHECK(n.attr<BatchNormAttrs>().channels_last);

  // dropout2d (a bit per example and channel) and avg_pool2d turn with their input.
  const auto dropped = rewrite_channels_last(build_sequential_forward(dropout_mean_pool_cnn(4)));
  REQUIRE(dropped);
  CHECK(dropped->inner_exits == 0);
  CHECK(count(dropped->graph, OpKind::to_channels_first) == 1);
  CHECK(count(dropped->graph, OpKind::dropout2d) == 1);
  CHECK(count(dropped->graph, OpKind::avg_pool2d) == 1);
  for (const Node& n : dropped->graph.nodes())  // the region's exit before the dropout, not the flatten
    if (n.op == OpKind::dropout) CHECK(dropped->graph.node(dropped->graph.value(n.inputs[0]).producer).op ==
                                       OpKind::to_channels_first);
  for (const Node& n : dropped->graph.nodes()) {
    if (n.op == OpKind::dropout2d) CHECK(n.attr<DropoutAttrs>().channels_last);
    if (n.op == OpKind::avg_pool2d) CHECK(n.attr<Pool2dAttrs>().channels_last);
  }

  // A layer without a channels-last form inside the region ends it there:
  // dropout's bit is keyed on the element's NCHW index.
  const SequentialSpec with_dropout = with_dropout_at(three_channel_cnn(4), 2, LayerKind::dropout, 0.25);
  const auto interrupted = rewrite_channels_last(build_sequential_forward(with_dropout));
  REQUIRE(interrupted);
  CHECK(interrupted->inner_exits == 1);
  // ... unless no region starts after it: a dropout before the flatten (of 5 x 2 x 2) converts once, as the
  // flatten would.
  const auto at_end = rewrite_channels_last(build_sequential_forward(dropout_before_flatten_cnn(4)));
  REQUIRE(at_end);
  CHECK(at_end->inner_exits == 0);
  CHECK(at_end->copies == rewrite_channels_last(build_sequential_forward(three_channel_cnn(4)))->copies);

  // No convolution: nothing to rewrite.
  SequentialSpec mlp = three_channel_cnn(4);
  mlp.input_shape = {12};
  mlp.layers = {net_layer(LayerKind::linear, 8), activation_layer(MlpActivation::relu),
                net_layer(LayerKind::linear, 4)};
  CHECK_FALSE(rewrite_channels_last(build_sequential_forward(mlp)));
}

TEST_CASE("channels-last training steps equal the NCHW ones in f64 (SGD with momentum, AdamW, 1-3 channels, BN, "
          "dropout2d and mean pooling, a dropout before the flatten)") {
  for (const int network : {0, 1, 2, 3, 4}) {
    for (const OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::adamw}) {
      const bool residual = network == 1;
      const SequentialSpec spec = network == 0   ? three_channel_cnn(5)
                                  : residual     ? residual_cnn(5)
                                  : network == 2 ? batch_norm_cnn(5)
                                  : network == 3 ? dropout_mean_pool_cnn(5)
                                                 : dropout_before_flatten_cnn(5);
      OptimizerSpec optimizer;
      optimizer.kind = kind;
      optimizer.lr = kind == OptimizerKind::sgd ? 0.05 : 0.01;
      optimizer.momentum = kind == OptimizerKind::sgd ? 0.9 : 0.0;
      optimizer.weight_decay = kind == OptimizerKind::adamw ? 0.01 : 0.0;
      const char* what = network == 0   ? "3 channels"
                         : residual     ? "residual, 1 channel"
                         : network == 2 ? "batch_norm"
                         : network == 3 ? "dropout2d, avg_pool2d"
                                        : "dropout before the flatten";
      INFO(what << ", " << optimizer_name(kind));
      const Graph forward = build_sequential_forward(spec);
      const auto start = train(forward, spec, optimizer, 0, 11);
      const auto nchw = train(forward, spec, optimizer, 3, 11);
      const auto last = train(rewrite_channels_last(forward)->graph, spec, optimizer, 3, 11);
      REQUIRE(nchw.size() == last.size());
      double diff = 0, norm = 0, moved = 0;
      for (std::size_t i = 0; i < nchw.size(); ++i) {
        REQUIRE(std::isfinite(last[i]));
        diff += (nchw[i] - last[i]) * (nchw[i] - last[i]);
        norm += nchw[i] * nchw[i];
        moved += (nchw[i] - start[i]) * (nchw[i] - start[i]);
      }
      CHECK(std::sqrt(diff / norm) < 1e-12);
      CHECK(std::sqrt(moved / norm) > 1e-4);  // the steps did move the parameters
    }
  }
}
