#include "runtime/plan/whole_step_match.hpp"

#include "graph/mlp_builder.hpp"
#include "graph/training_graph.hpp"

namespace sg {
namespace {

const Node* find_node(const Graph& g, OpKind op, int input_slot, ValueId input) {
  for (const Node& n : g.nodes())
    if (n.op == op && static_cast<int>(n.inputs.size()) > input_slot &&
        n.inputs[static_cast<std::size_t>(input_slot)] == input)
      return &n;
  return nullptr;
}

// The MLP spec and optimizer the graph would have been built from.
std::optional<std::pair<MlpSpec, SgdSpec>> read_spec(const Graph& g) {
  MlpSpec mlp;
  for (std::size_t l = 1;; ++l) {
    const auto w = g.find_value(names::weight(l));
    if (!w) break;
    const Value& wv = g.value(*w);
    if (wv.role != Role::param || wv.shape.size() != 2) return std::nullopt;
    if (l == 1) mlp.layers.push_back(wv.shape[1]);
    mlp.layers.push_back(wv.shape[0]);
    mlp.weight_dtype = wv.dtype;
  }
  const auto images = g.find_value(names::images);
  if (mlp.layers.size() < 2 || !images || g.value(*images).shape.size() != 2) return std::nullopt;
  mlp.dataset_rows = g.value(*images).shape[0];
  const Node* indices = nullptr;
  const Node* gather = nullptr;
  const Node* sgd = nullptr;
  for (const Node& n : g.nodes()) {
    if (n.op == OpKind::batch_indices && !indices) indices = &n;
    if (n.op == OpKind::gather_rows && n.inputs[0] == *images && !gather) gather = &n;
    if (n.op == OpKind::sgd_update && !sgd) sgd = &n;
  }
  if (!indices || !gather || !sgd) return std::nullopt;
  mlp.batch = indices->attrs.batch;
  mlp.compute_dtype = g.value(gather->outputs[0]).dtype;
  mlp.input_scale = gather->attrs.scale;
  mlp.input_shift = gather->attrs.shift;
  return std::make_pair(mlp, SgdSpec{sgd->attrs.lr, sgd->attrs.momentum, sgd->attrs.weight_decay});
}

}  // namespace

std::optional<WholeStepPlan> match_whole_step(const Graph& g) {
  const auto spec = read_spec(g);
  if (!spec) return std::nullopt;
  const auto& [mlp, sgd] = *spec;
  try {
    if (!(build_training_stages(mlp, sgd).fused == g)) return std::nullopt;
  } catch (const GraphError&) {
    return std::nullopt;
  }
  WholeStepPlan plan;
  plan.dims = mlp.layers;
  plan.batch = mlp.batch;
  plan.input_scale = mlp.input_scale;
  plan.input_shift = mlp.input_shift;
  plan.images = g.value_named(names::images);
  plan.labels = g.value_named(names::labels);
  plan.perm = g.value_named(names::perm);
  plan.step = g.value_named(names::step);
  plan.loss = g.value_named(names::loss);
  // Parameters the matmuls read directly (no master-weight casts) are what
  // a whole-step kernel updates in place; anything else is not a match.
  const std::size_t count = mlp.layers.size() - 1;
  for (std::size_t l = 1; l <= count; ++l) {
    WholeStepLayer layer;
    layer.weight = g.value_named(names::weight(l));
    layer.bias = g.value_named(names::bias(l));
    const Node* weight_sgd = find_node(g, OpKind::sgd_update, 0, layer.weight);
    const Node* bias_sgd = find_node(g, OpKind::sgd_update, 0, layer.bias);
    const Node* add = find_node(g, OpKind::bias_add, 1, layer.bias);  // matmul(x, w) -> bias_add(., b)
    if (!weight_sgd || !bias_sgd || !add) return std::nullopt;
    layer.weight_sgd = weight_sgd->id;
    layer.bias_sgd = bias_sgd->id;
    layer.output = add->outputs[0];
    if (l < count) {
      const Node* relu = find_node(g, OpKind::relu, 0, add->outputs[0]);
      const Node* relu_bw = relu ? find_node(g, OpKind::relu_backward, 1, relu->outputs[0]) : nullptr;
      if (!relu_bw) return std::nullopt;
      layer.output = relu->outputs[0];
      layer.pre_activation_grad = relu_bw->outputs[0];
    }
    plan.layers.push_back(layer);
  }
  return plan;
}

}  // namespace sg
