#include "graph/optimizer_pass.hpp"

#include <algorithm>

namespace sg {
namespace {

// First position after every node that produces `grad` or reads `param`.
std::size_t earliest_update_position(const Graph& g, ValueId param, ValueId grad) {
  std::size_t pos = static_cast<std::size_t>(g.value(grad).producer) + 1;
  for (NodeId reader : g.consumers(param)) pos = std::max(pos, static_cast<std::size_t>(reader) + 1);
  return pos;
}

}  // namespace

void append_sgd(Graph& g, const GradientMap& grads, const SgdSpec& sgd) {
  const SgdUpdateAttrs attrs{sgd.momentum, sgd.weight_decay};  // sgd.lr is the executors' run state
  for (const auto& [param, grad] : grads.of_param) {
    std::vector<ValueId> inputs{param, grad};
    if (sgd.momentum > 0.0) {
      const Value& p = g.value(param);
      inputs.push_back(g.state("vel_" + p.name, p.shape, p.dtype));
    }
    g.insert_node(earliest_update_position(g, param, grad), OpKind::sgd_update, inputs, attrs, Role::activation, {});
  }
}

}  // namespace sg
