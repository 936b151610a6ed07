#include "graph/autodiff.hpp"

#include <fmt/format.h>

#include "graph/op_registry.hpp"

namespace sg {
namespace {

// Accumulates gradient contributions per value; summing happens (with `add`
// nodes) only when a value has more than one consumer.
class GradientTable {
 public:
  explicit GradientTable(Graph& g) : g_(g) {}

  void contribute(ValueId value, ValueId grad) {
    auto [it, inserted] = grads_.try_emplace(value, grad);
    if (!inserted)
      it->second = g_.append_node(OpKind::add, {it->second, grad}, NoAttrs{}, Role::grad, "grad_" + g_.value(value).name).front();
  }
  std::optional<ValueId> find(ValueId value) const {
    auto it = grads_.find(value);
    return it == grads_.end() ? std::nullopt : std::optional(it->second);
  }

 private:
  Graph& g_;
  std::map<ValueId, ValueId> grads_;
};

std::vector<bool> values_needing_grad(const Graph& g) {
  std::vector<bool> needs(g.values().size(), false);
  for (const auto& v : g.values()) needs[static_cast<std::size_t>(v.id)] = v.role == Role::param;
  for (const auto& n : g.nodes()) {
    bool any = false;
    for (ValueId in : n.inputs) any = any || needs[static_cast<std::size_t>(in)];
    for (ValueId out : n.outputs) needs[static_cast<std::size_t>(out)] = any && is_floating(g.value(out).dtype);
  }
  return needs;
}

// The loss value's producer, checked: a registered loss with a scalar output.
const Node& loss_node(const Graph& g, ValueId loss) {
  const Value& v = g.value(loss);
  if (v.producer < 0)
    throw GraphError(fmt::format("autodiff: loss '{}' is a {} value, not the output of a loss op", v.name, role_name(v.role)));
  const Node& n = g.node(v.producer);
  if (!op_def(n.op).is_loss())
    throw GraphError(fmt::format("autodiff: loss '{}' is the output of {} (node {}), which is not a loss op", v.name,
                                 op_name(n.op), n.id));
  if (element_count(v.shape) != 1)
    throw GraphError(fmt::format("autodiff: loss '{}' {} is not a scalar", v.name, shape_string(v.shape)));
  return n;
}

}  // namespace

GradientMap append_backward(Graph& g, ValueId loss) {
  const NodeId seed = loss_node(g, loss).id;
  const auto needs = values_needing_grad(g);
  GradientTable table(g);
  auto sink = [&](ValueId value, ValueId grad) { table.contribute(value, grad); };
  const std::size_t forward_nodes = g.nodes().size();

  for (std::size_t i = forward_nodes; i-- > 0;) {
    const Node n = g.nodes()[i];  // copy: appending nodes reallocates
    const OpDef& def = op_def(n.op);
    std::vector<std::optional<ValueId>> output_grads;
    bool any = false;
    for (ValueId out : n.outputs) {
      output_grads.push_back(table.find(out));
      any = any || output_grads.back().has_value();
    }
    std::vector<bool> input_needs;
    for (ValueId in : n.inputs) input_needs.push_back(needs[static_cast<std::size_t>(in)]);
    if (n.id == seed) {
      def.loss_gradient(GradientContext(g, n, std::vector<std::optional<ValueId>>(n.outputs.size()),
                                        std::move(input_needs), sink));
      continue;
    }
    if (!any) continue;  // no output reaches the loss
    if (!def.gradient)
      throw GraphError(fmt::format("autodiff: op {} (node {}) has no gradient rule", op_name(n.op), n.id));
    def.gradient(GradientContext(g, n, std::move(output_grads), std::move(input_needs), sink));
  }

  GradientMap result;
  for (const auto& v : g.values())
    if (v.role == Role::param) {
      auto grad = table.find(v.id);
      if (!grad) throw GraphError(fmt::format("autodiff: parameter '{}' does not reach the loss", v.name));
      result.of_param[v.id] = *grad;
    }
  return result;
}

}  // namespace sg
