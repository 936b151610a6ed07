// Autodiff, optimizer and fusion passes on the reference network: structure
// only (numerics are checked against finite differences in tests/runtime).
#include <doctest/doctest.h>

#include <algorithm>
#include <map>

#include "graph/verifier.hpp"
#include "models/mlp.hpp"

using namespace sg;

namespace {

MlpSpec reference_spec(DType weights = DType::f16) {
  MlpSpec spec;
  spec.layers = {784, 128, 128, 128, 10};
  spec.weight_dtype = weights;
  return spec;
}

std::map<OpKind, int> op_counts(const Graph& g) {
  std::map<OpKind, int> counts;
  for (const auto& n : g.nodes()) ++counts[n.op];
  return counts;
}

std::map<FusionKind, int> group_counts(const Graph& g) {
  std::map<FusionKind, int> counts;
  for (const auto& fg : g.fusion_groups()) ++counts[fg.kind];
  return counts;
}

}  // namespace

TEST_CASE("autodiff adds one gradient per parameter and no gradient for the input") {
  Graph g = build_mlp_forward(reference_spec());
  const auto forward_nodes = g.nodes().size();
  const auto grads = append_backward(g, g.value_named(names::loss));
  CHECK(find_graph_problems(g).empty());
  CHECK(grads.of_param.size() == 8);
  for (const auto& [param, grad] : grads.of_param) {
    CHECK(g.value(grad).shape == g.value(param).shape);
    CHECK(g.value(grad).role == Role::grad);
  }
  auto counts = op_counts(g);
  // 4 forward matmuls; backward: 4 weight gradients + 3 input gradients (not for x).
  CHECK(counts[OpKind::matmul] == 4 + 4 + 3);
  CHECK(counts[OpKind::relu_backward] == 3);
  CHECK(counts[OpKind::reduce_rows] == 4);
  CHECK(counts[OpKind::softmax_xent_backward] == 1);
  CHECK(g.nodes().size() == forward_nodes + 4 + 3 + 3 + 4 + 1);
  CHECK_THROWS_AS(append_backward(g, g.value_named("w1")), GraphError);
}

TEST_CASE("sgd updates sit right after the last use of their parameter") {
  auto stages = build_training_stages(reference_spec(), {0.003, 0.0, 0.0});
  const Graph& g = stages.optimized;
  int updates = 0;
  for (const auto& n : g.nodes()) {
    if (n.op != OpKind::sgd_update) continue;
    ++updates;
    const ValueId param = n.inputs[0];
    for (NodeId reader : g.consumers(param)) CHECK(reader <= n.id);
    CHECK(g.value(n.inputs[1]).producer < n.id);
    // As early as legal: the node just before is the gradient's producer or the last reader.
    const Node& prev = g.node(n.id - 1);
    const bool prev_is_needed = prev.id == g.value(n.inputs[1]).producer ||
                                std::find(prev.inputs.begin(), prev.inputs.end(), param) != prev.inputs.end() ||
                                prev.op == OpKind::sgd_update;
    CHECK(prev_is_needed);
  }
  CHECK(updates == 8);
  CHECK(g.nodes().back().op == OpKind::advance_step);

  auto momentum = build_training_stages(reference_spec(), {0.01, 0.9, 1e-4});
  CHECK(momentum.optimized.values_with_role(Role::state).size() == 1 + 8);  // step + velocities
}

TEST_CASE("fusion groups of the reference network") {
  auto stages = build_training_stages(reference_spec(), {0.003, 0.0, 0.0});
  const Graph& g = stages.fused;
  auto groups = group_counts(g);
  CHECK(groups[FusionKind::batch_fetch] == 1);
  CHECK(groups[FusionKind::linear_forward] == 4);  // 3 with relu, the logits layer without
  CHECK(groups[FusionKind::dgrad_drelu] == 3);
  CHECK(groups[FusionKind::wgrad_sgd] == 4);
  CHECK(groups[FusionKind::bgrad_sgd] == 4);
  CHECK(groups[FusionKind::xent_fused] == 1);
  int with_relu = 0;
  for (const auto& fg : g.fusion_groups())
    if (fg.kind == FusionKind::linear_forward) with_relu += fg.nodes.size() == 3;
  CHECK(with_relu == 3);
  // Every node but the step advance is in a group.
  int alone = 0;
  for (const auto& n : g.nodes()) alone += n.fusion_group < 0;
  CHECK(alone == 1);
  // Fusion only annotates: stripping the groups gives back the optimized graph.
  Graph stripped = g;
  stripped.set_fusion_groups({});
  CHECK(stripped == stages.optimized);
}

TEST_CASE("fp32 master weights: the weight gradient is cast and still fused into its update") {
  auto stages = build_training_stages(reference_spec(DType::f32), {0.003, 0.0, 0.0});
  const Graph& g = stages.fused;
  auto groups = group_counts(g);
  CHECK(groups[FusionKind::wgrad_sgd] == 4);
  CHECK(groups[FusionKind::bgrad_sgd] == 4);
  for (const auto& fg : g.fusion_groups())
    if (fg.kind == FusionKind::wgrad_sgd) {
      REQUIRE(fg.nodes.size() == 3);
      CHECK(g.node(fg.nodes[0]).op == OpKind::matmul);
      CHECK(g.node(fg.nodes[1]).op == OpKind::cast);
      CHECK(g.node(fg.nodes[2]).op == OpKind::sgd_update);
    }
}

TEST_CASE("fusion options switch patterns off") {
  FusionOptions none{false, false, false, false};
  auto stages = build_training_stages(reference_spec(), {0.003, 0.0, 0.0}, none);
  CHECK(stages.fused.fusion_groups().empty());
  FusionOptions no_sgd;
  no_sgd.fused_sgd = false;
  auto partial = build_training_stages(reference_spec(), {0.003, 0.0, 0.0}, no_sgd);
  auto groups = group_counts(partial.fused);
  CHECK(groups[FusionKind::wgrad_sgd] == 0);
  CHECK(groups[FusionKind::linear_forward] == 4);
}
