// The CUDA cover of issue 37's ops (no GPU needed): each of avg_pool2d,
// global_avg_pool2d, layer_norm, concat, augment_images and the four batch
// normalisation ops, with their gradients, is taken by its own lowering, and
// a running-statistics update writes its state in place (Launch::updates);
// batch_norm's launch takes the residual add / ReLU after it and the
// relu_backward / gradient add before its backward only where nothing else
// reads what they pass on.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>

#include "graph/autodiff.hpp"
#include "tests/runtime/schedule_test_support.hpp"

using namespace sg;
using namespace sg::schedule_test;

TEST_CASE("the CUDA lowerings take issue 37's ops and their gradients, one launch per node") {
  Graph g;
  const auto x = g.input("x", {8, 3, 12, 12}, DType::f16);
  const auto step = g.state("step", {1}, DType::i32);
  const auto w = g.param("w", {4, 3, 3, 3}, DType::f16);
  const auto gamma = g.param("gamma", {4}, DType::f16);
  const auto beta = g.param("beta", {4}, DType::f16);
  const auto mean = g.state("running_mean", {4}, DType::f32);
  const auto var = g.state("running_var", {4}, DType::f32);
  const auto ln_w = g.param("ln_w", {7, 3, 3}, DType::f16);
  const auto ln_b = g.param("ln_b", {7, 3, 3}, DType::f16);
  const BatchNormAttrs bn{1e-5, 0.1};
  const auto aug = g.append_node(OpKind::augment_images, {x, step}, AugmentAttrs{2, true, 0.0, 1, 0}).front();
  const auto conv = g.append_node(OpKind::conv2d, {aug, w}, Conv2dAttrs{1, 1, 0, 0}).front();
  const auto normed = g.append_node(OpKind::batch_norm, {conv, gamma, beta}, bn).front();
  g.append_node(OpKind::batch_norm_stats_update, {conv, mean, var}, bn);
  const auto pooled = g.append_node(OpKind::avg_pool2d, {g.relu(normed)}, Pool2dAttrs{4, 4}).front();  // 3x3
  const auto joined = g.append_node(OpKind::concat, {pooled, g.append_node(OpKind::avg_pool2d, {aug}, Pool2dAttrs{4, 4}).front()},
                                    NoAttrs{})
                          .front();  // 4 + 3 channels
  const auto ln = g.append_node(OpKind::layer_norm, {joined, ln_w, ln_b}, LayerNormAttrs{1e-5}).front();
  const auto head = g.flatten(g.append_node(OpKind::global_avg_pool2d, {ln}, NoAttrs{}).front());
  const auto loss = g.softmax_xent(head, g.label("labels", {8}, DType::i32));
  append_backward(g, loss);
  // Inference reads the running statistics: an eval graph of its own (a
  // schedule reads no state after its in-place update).
  Graph eval;
  const auto ex = eval.input("x", {8, 4, 10, 10}, DType::f16);
  eval.mark_output(eval.append_node(OpKind::batch_norm_inference,
                                    {ex, eval.input("gamma", {4}, DType::f16), eval.input("beta", {4}, DType::f16),
                                     eval.state("running_mean", {4}, DType::f32),
                                     eval.state("running_var", {4}, DType::f32)},
                                    bn)
                       .front());

  BackendOptions options;
  const Lowered l = lower(g, options);
  const Lowered le = lower(eval, options);
  std::map<OpKind, std::string> lowering_of;
  for (const Launch& launch : l.schedule.launches)
    for (NodeId n : launch.nodes) lowering_of[g.node(n).op] = name_of(launch);
  for (const Launch& launch : le.schedule.launches)
    for (NodeId n : launch.nodes) lowering_of[eval.node(n).op] = name_of(launch);
  const std::map<OpKind, std::string> expected = {
      {OpKind::augment_images, "augment_images"},
      {OpKind::batch_norm, "batch_norm"},
      {OpKind::batch_norm_backward, "batch_norm"},
      {OpKind::batch_norm_stats_update, "batch_norm"},
      {OpKind::batch_norm_inference, "batch_norm"},
      {OpKind::avg_pool2d, "avg_pool2d"},
      {OpKind::avg_pool2d_backward, "avg_pool2d"},
      {OpKind::global_avg_pool2d, "avg_pool2d"},
      {OpKind::global_avg_pool2d_backward, "avg_pool2d"},
      {OpKind::concat, "concat"},
      {OpKind::slice_channels, "concat"},
      {OpKind::layer_norm, "layer_norm"},
      {OpKind::layer_norm_backward, "layer_norm"},
  };
  for (const auto& [op, lowering] : expected) {
    CAPTURE(op_name(op));
    REQUIRE(lowering_of.count(op) == 1);
    CHECK(lowering_of.at(op) == lowering);
  }
  for (const Launch& launch : l.schedule.launches)
    if (g.node(launch.nodes.front()).op == OpKind::batch_norm_stats_update) {
      CHECK(updates(launch, mean));
      CHECK(updates(launch, var));
    }
}

namespace {

// The ops of the launch that runs node n, sorted.
std::vector<OpKind> ops_with(const Graph& g, const Schedule& s, NodeId n) {
  for (const Launch& l : s.launches)
    if (std::find(l.nodes.begin(), l.nodes.end(), n) != l.nodes.end()) {
      std::vector<OpKind> ops;
      for (NodeId m : l.nodes) ops.push_back(g.node(m).op);
      std::sort(ops.begin(), ops.end());
      return ops;
    }
  return {};
}

std::vector<OpKind> sorted_ops(std::vector<OpKind> ops) {
  std::sort(ops.begin(), ops.end());
  return ops;
}

}  // namespace

TEST_CASE("batch_norm's launch takes the residual add and ReLU after it only where they read nothing later") {
  const BatchNormAttrs bn{1e-5, 0.1};
  for (const int variant : {0, 1, 2}) {  // 0: fused; 1: the skip comes after the batch_norm; 2: its output read twice
    CAPTURE(variant);
    Graph g;
    const auto x = g.input("x", {8, 4, 6, 6}, DType::f16);
    const auto mean = g.state("running_mean", {4}, DType::f32);
    const auto var = g.state("running_var", {4}, DType::f32);
    g.append_node(OpKind::batch_norm_stats_update, {x, mean, var}, bn);
    const auto y = g.append_node(OpKind::batch_norm, {x, g.param("gamma", {4}, DType::f16), g.param("beta", {4}, DType::f16)},
                                 bn)
                       .front();
    const auto skip = variant == 1 ? g.relu(g.input("late", {8, 4, 6, 6}, DType::f16)) : g.input("skip", {8, 4, 6, 6}, DType::f16);
    const auto out = g.relu(g.append_node(OpKind::add, {y, skip}, NoAttrs{}).front());
    g.mark_output(out);
    if (variant == 2) g.mark_output(g.relu(y));
    const Lowered l = lower(g, BackendOptions{});
    const NodeId norm = g.value(y).producer;
    const auto launched = ops_with(g, l.schedule, norm);
    if (variant == 0) {
      CHECK(launched == sorted_ops({OpKind::batch_norm_stats_update, OpKind::batch_norm, OpKind::add, OpKind::relu}));
      for (const Launch& launch : l.schedule.launches)
        if (name_of(launch) == "batch_norm") {
          CHECK(launch.lowering->describe(g, launch) == "train + running statistics + add + relu");
          CHECK(writes(launch, out));
          CHECK(!writes(launch, y));  // the normalised values never reach memory
          CHECK(reads(launch, skip));
        }
    } else {
      CHECK(launched == sorted_ops({OpKind::batch_norm_stats_update, OpKind::batch_norm}));
    }
  }
}

TEST_CASE("batch_norm_backward's launch takes the relu_backward and the add of two gradients that alone feed it") {
  const BatchNormAttrs bn{1e-5, 0.1};
  for (const bool sum_read_elsewhere : {false, true}) {
    CAPTURE(sum_read_elsewhere);
    Graph g;
    const Shape shape{8, 4, 6, 6};
    const auto sum = g.append_node(OpKind::add, {g.input("g1", shape, DType::f16), g.input("g2", shape, DType::f16)},
                                   NoAttrs{})
                         .front();
    const auto dy = g.relu_backward(sum, g.input("relu_out", shape, DType::f16));
    const auto grads = g.append_node(OpKind::batch_norm_backward,
                                     {dy, g.input("x", shape, DType::f16), g.param("gamma", {4}, DType::f16)}, bn);
    for (ValueId v : grads) g.mark_output(v);
    if (sum_read_elsewhere) g.mark_output(sum);
    const Lowered l = lower(g, BackendOptions{});
    const auto launched = ops_with(g, l.schedule, g.value(grads[0]).producer);
    if (!sum_read_elsewhere) {
      CHECK(launched == sorted_ops({OpKind::add, OpKind::relu_backward, OpKind::batch_norm_backward}));
    } else {
      CHECK(launched == sorted_ops({OpKind::relu_backward, OpKind::batch_norm_backward}));
      CHECK(ops_with(g, l.schedule, g.value(sum).producer) == std::vector<OpKind>{OpKind::add});
    }
  }
}
