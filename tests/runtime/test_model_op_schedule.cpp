// The CUDA cover of issue 37's ops (no GPU needed): each of avg_pool2d,
// global_avg_pool2d, layer_norm, concat, augment_images and the four batch
// normalisation ops, with their gradients, is taken by its own lowering, one
// launch per node, and a running-statistics update writes its state in
// place (Launch::updates).
#include <doctest/doctest.h>

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
