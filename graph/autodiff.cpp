#include "graph/autodiff.hpp"

#include <fmt/format.h>

namespace sg {
namespace {

// Accumulates gradient contributions per value; summing happens (with `add`
// nodes) only when a value has more than one consumer.
class GradientTable {
 public:
  explicit GradientTable(Graph& g) : g_(g) {}

  void contribute(ValueId value, ValueId grad) {
    auto [it, inserted] = grads_.try_emplace(value, grad);
    if (!inserted) it->second = g_.append_node(OpKind::add, {it->second, grad}, {}, Role::grad, grad_name(value)).front();
  }
  std::optional<ValueId> find(ValueId value) const {
    auto it = grads_.find(value);
    return it == grads_.end() ? std::nullopt : std::optional(it->second);
  }
  std::string grad_name(ValueId value) const { return "grad_" + g_.value(value).name; }

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

// Gradients of C = op(A) op(B) with respect to A and B (dA first: for a layer
// that is dX, so every read of the weight precedes its own gradient).
void matmul_rule(Graph& g, const Node& n, ValueId dc, const std::vector<bool>& needs, GradientTable& t) {
  const ValueId a = n.inputs[0], b = n.inputs[1];
  const bool ta = n.attrs.trans_a, tb = n.attrs.trans_b;
  auto emit = [&](ValueId target, ValueId lhs, ValueId rhs, bool tl, bool tr) {
    if (!needs[static_cast<std::size_t>(target)]) return;
    OpAttrs at;
    at.trans_a = tl;
    at.trans_b = tr;
    t.contribute(target, g.append_node(OpKind::matmul, {lhs, rhs}, at, Role::grad, t.grad_name(target)).front());
  };
  if (!ta && !tb) {
    emit(a, dc, b, false, true);  // dA = dC B^T
    emit(b, a, dc, true, false);  // dB = A^T dC
  } else if (!ta && tb) {
    emit(a, dc, b, false, false);  // dA = dC B
    emit(b, dc, a, true, false);   // dB = dC^T A
  } else if (ta && !tb) {
    emit(a, b, dc, false, true);   // dA = B dC^T
    emit(b, a, dc, false, false);  // dB = A dC
  } else {
    emit(a, b, dc, true, true);  // dA = B^T dC^T
    emit(b, dc, a, true, true);  // dB = dC^T A^T
  }
}

void apply_rule(Graph& g, const Node& n, ValueId dy, const std::vector<bool>& needs, GradientTable& t) {
  auto needs_grad = [&](int slot) { return needs[static_cast<std::size_t>(n.inputs[static_cast<std::size_t>(slot)])]; };
  auto in = [&](int slot) { return n.inputs[static_cast<std::size_t>(slot)]; };
  switch (n.op) {
    case OpKind::matmul:
      matmul_rule(g, n, dy, needs, t);
      return;
    case OpKind::bias_add:
      if (needs_grad(0)) t.contribute(in(0), dy);
      if (needs_grad(1))
        t.contribute(in(1), g.append_node(OpKind::reduce_rows, {dy}, {}, Role::grad, t.grad_name(in(1))).front());
      return;
    case OpKind::relu:
      t.contribute(in(0), g.append_node(OpKind::relu_backward, {dy, n.outputs[0]}, {}, Role::grad, t.grad_name(in(0))).front());
      return;
    case OpKind::add:
      if (needs_grad(0)) t.contribute(in(0), dy);
      if (needs_grad(1)) t.contribute(in(1), dy);
      return;
    case OpKind::cast: {
      OpAttrs a;
      a.out_dtype = g.value(in(0)).dtype;
      t.contribute(in(0), g.append_node(OpKind::cast, {dy}, a, Role::grad, t.grad_name(in(0))).front());
      return;
    }
    default:
      throw GraphError(fmt::format("autodiff: op {} (node {}) has no gradient rule", op_name(n.op), n.id));
  }
}

}  // namespace

GradientMap append_backward(Graph& g, ValueId loss) {
  const Value& loss_value = g.value(loss);
  if (loss_value.producer < 0 || g.node(loss_value.producer).op != OpKind::softmax_xent)
    throw GraphError(fmt::format("autodiff: loss '{}' must be the output of softmax_xent", loss_value.name));
  const auto needs = values_needing_grad(g);
  GradientTable table(g);
  const std::size_t forward_nodes = g.nodes().size();

  for (std::size_t i = forward_nodes; i-- > 0;) {
    const Node n = g.nodes()[i];  // copy: appending nodes reallocates
    if (n.op == OpKind::softmax_xent && n.outputs[0] == loss) {
      if (needs[static_cast<std::size_t>(n.inputs[0])])
        table.contribute(n.inputs[0], g.append_node(OpKind::softmax_xent_backward, {n.inputs[0], n.inputs[1]}, {},
                                                    Role::grad, table.grad_name(n.inputs[0])).front());
      continue;
    }
    if (n.outputs.size() != 1) continue;
    const auto dy = table.find(n.outputs[0]);
    if (!dy) continue;  // output does not reach the loss
    apply_rule(g, n, *dy, needs, table);
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
