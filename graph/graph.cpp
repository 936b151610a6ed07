#include "graph/graph.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "graph/shape_inference.hpp"

namespace sg {

ValueId Graph::add_owned(std::string name, Shape shape, DType dtype, Role role) {
  if (find_value(name)) throw GraphError(fmt::format("value name '{}' is already used", name));
  for (auto d : shape)
    if (d <= 0) throw GraphError(fmt::format("value '{}' has a non-positive dimension {}", name, shape_string(shape)));
  return add_value_raw(Value{-1, std::move(name), std::move(shape), dtype, role, -1});
}

ValueId Graph::input(std::string name, Shape shape, DType dtype) {
  return add_owned(std::move(name), std::move(shape), dtype, Role::input);
}
ValueId Graph::label(std::string name, Shape shape, DType dtype) {
  return add_owned(std::move(name), std::move(shape), dtype, Role::label);
}
ValueId Graph::param(std::string name, Shape shape, DType dtype) {
  return add_owned(std::move(name), std::move(shape), dtype, Role::param);
}
ValueId Graph::state(std::string name, Shape shape, DType dtype) {
  return add_owned(std::move(name), std::move(shape), dtype, Role::state);
}

ValueId Graph::batch_indices(ValueId perm, ValueId step, std::int64_t batch, std::int64_t rank, std::int64_t ranks) {
  return append_node(OpKind::batch_indices, {perm, step}, BatchIndicesAttrs{batch, rank, ranks}).front();
}

ValueId Graph::gather_rows(ValueId table, ValueId indices, DType out_dtype, double scale, double shift,
                           std::string name) {
  return append_node(OpKind::gather_rows, {table, indices}, GatherRowsAttrs{out_dtype, scale, shift}, Role::activation,
                     std::move(name))
      .front();
}

ValueId Graph::matmul(ValueId a, ValueId b, bool trans_a, bool trans_b) {
  return append_node(OpKind::matmul, {a, b}, MatmulAttrs{trans_a, trans_b}).front();
}

ValueId Graph::bias_add(ValueId x, ValueId bias) { return append_node(OpKind::bias_add, {x, bias}, NoAttrs{}).front(); }
ValueId Graph::linear(ValueId x, ValueId w, ValueId b) { return bias_add(matmul(x, w, false, true), b); }
ValueId Graph::relu(ValueId x) { return append_node(OpKind::relu, {x}, NoAttrs{}).front(); }
ValueId Graph::relu_backward(ValueId dy, ValueId y) {
  return append_node(OpKind::relu_backward, {dy, y}, NoAttrs{}, Role::grad).front();
}
ValueId Graph::gelu(ValueId x) { return append_node(OpKind::gelu, {x}, NoAttrs{}).front(); }
ValueId Graph::gelu_backward(ValueId dy, ValueId x) {
  return append_node(OpKind::gelu_backward, {dy, x}, NoAttrs{}, Role::grad).front();
}
std::vector<ValueId> Graph::bias_add_relu(ValueId x, ValueId bias) {
  return append_node(OpKind::bias_add_relu, {x, bias}, NoAttrs{});
}
ValueId Graph::softmax_xent(ValueId logits, ValueId labels) {
  return append_node(OpKind::softmax_xent, {logits, labels}, NoAttrs{}, Role::activation, "loss").front();
}
ValueId Graph::softmax_xent_backward(ValueId logits, ValueId labels) {
  return append_node(OpKind::softmax_xent_backward, {logits, labels}, NoAttrs{}, Role::grad).front();
}
ValueId Graph::reduce_rows(ValueId x) { return append_node(OpKind::reduce_rows, {x}, NoAttrs{}).front(); }
ValueId Graph::add(ValueId a, ValueId b) { return append_node(OpKind::add, {a, b}, NoAttrs{}).front(); }
ValueId Graph::cast(ValueId x, DType to) { return append_node(OpKind::cast, {x}, CastAttrs{to}).front(); }
ValueId Graph::count_correct(ValueId logits, ValueId labels) {
  return append_node(OpKind::count_correct, {logits, labels}, NoAttrs{}, Role::activation, "correct").front();
}

void Graph::sgd_update(ValueId param, ValueId grad, double momentum, double weight_decay,
                       std::optional<ValueId> velocity) {
  std::vector<ValueId> in{param, grad};
  if (velocity) in.push_back(*velocity);
  append_node(OpKind::sgd_update, std::move(in), SgdUpdateAttrs{momentum, weight_decay});
}

void Graph::advance_step(ValueId step) { append_node(OpKind::advance_step, {step}, NoAttrs{}); }

ValueId Graph::conv2d(ValueId x, ValueId w, std::optional<ValueId> bias, int stride, int padding) {
  std::vector<ValueId> in{x, w};
  if (bias) in.push_back(*bias);
  return append_node(OpKind::conv2d, std::move(in), Conv2dAttrs{stride, padding}).front();
}
ValueId Graph::max_pool2d(ValueId x, int kernel, int stride) {
  return append_node(OpKind::max_pool2d, {x}, Pool2dAttrs{kernel, stride}).front();
}
ValueId Graph::flatten(ValueId x) { return append_node(OpKind::flatten, {x}, NoAttrs{}).front(); }
ValueId Graph::reshape(ValueId x, Shape shape) {
  return append_node(OpKind::reshape, {x}, ReshapeAttrs{std::move(shape)}).front();
}
ValueId Graph::dropout2d(ValueId x, double p, ValueId step, std::uint64_t seed, std::int64_t stream) {
  return append_node(OpKind::dropout2d, {x, step}, DropoutAttrs{p, seed, stream}).front();
}

std::vector<ValueId> Graph::append_node(OpKind op, std::vector<ValueId> inputs, OpAttrs attrs,
                                        Role output_role, std::string name) {
  return insert_node(nodes_.size(), op, std::move(inputs), attrs, output_role, std::move(name));
}

std::vector<ValueId> Graph::insert_node(std::size_t position, OpKind op, std::vector<ValueId> inputs,
                                        OpAttrs attrs, Role output_role, std::string name) {
  if (position > nodes_.size()) throw GraphError("insert_node: position past the end");
  if (!groups_.empty()) throw GraphError("nodes cannot be added after fusion");
  std::vector<const Value*> in;
  for (ValueId id : inputs) in.push_back(&value(id));
  const auto specs = infer_outputs(op, in, attrs);

  Node node;
  node.op = op;
  node.inputs = std::move(inputs);
  node.attrs = std::move(attrs);
  nodes_.insert(nodes_.begin() + static_cast<std::ptrdiff_t>(position), node);
  renumber_from(position);
  for (const auto& spec : specs) {
    std::string base = name.empty() ? std::string(op_name(op)) : name;
    Value v{-1, unique_name(base), spec.shape, spec.dtype, output_role, static_cast<NodeId>(position)};
    nodes_[position].outputs.push_back(add_value_raw(std::move(v)));
  }
  return nodes_[position].outputs;
}

void Graph::expect_same_outputs(std::string_view who, NodeId node, const std::vector<ValueId>& inputs,
                                const OpAttrs& attrs) const {
  const Node& n = this->node(node);
  std::vector<const Value*> in;
  for (ValueId id : inputs) in.push_back(&value(id));
  const auto specs = infer_outputs(n.op, in, attrs);  // (throws for attributes of another kind or bad values)
  for (std::size_t i = 0; i < specs.size(); ++i)
    if (i >= n.outputs.size() || specs[i].shape != value(n.outputs[i]).shape ||
        specs[i].dtype != value(n.outputs[i]).dtype)
      throw GraphError(fmt::format("{}: node {} ({}) would change its outputs", who, node, op_name(n.op)));
}

void Graph::set_attrs(NodeId node, OpAttrs attrs) {
  if (!groups_.empty()) throw GraphError("attributes cannot change after fusion");
  expect_same_outputs("set_attrs", node, this->node(node).inputs, attrs);
  nodes_[static_cast<std::size_t>(node)].attrs = std::move(attrs);
}

void Graph::rewire(NodeId node, std::vector<ValueId> inputs, OpAttrs attrs) {
  if (!groups_.empty()) throw GraphError("inputs cannot change after fusion");
  for (ValueId id : inputs)
    if (value(id).producer >= node)
      throw GraphError(fmt::format("rewire: node {} would read {} before it is produced", node, value(id).name));
  expect_same_outputs("rewire", node, inputs, attrs);
  Node& changed = nodes_.at(static_cast<std::size_t>(node));
  changed.inputs = std::move(inputs);
  changed.attrs = std::move(attrs);
}

void Graph::read_instead(NodeId reader, ValueId was, ValueId now) {
  if (!groups_.empty()) throw GraphError("inputs cannot change after fusion");
  const Value &old_value = value(was), &new_value = value(now);
  if (old_value.shape != new_value.shape || old_value.dtype != new_value.dtype)
    throw GraphError(fmt::format("read_instead: {} does not stand for {} (shape or dtype)", new_value.name,
                                 old_value.name));
  if (new_value.producer >= reader)
    throw GraphError(fmt::format("read_instead: node {} would read {} before it is produced", reader, new_value.name));
  Node& n = nodes_.at(static_cast<std::size_t>(reader));
  if (std::find(n.inputs.begin(), n.inputs.end(), was) == n.inputs.end())
    throw GraphError(fmt::format("read_instead: node {} does not read {}", reader, old_value.name));
  std::replace(n.inputs.begin(), n.inputs.end(), was, now);
}

void Graph::move_after(NodeId node, NodeId after, std::vector<ValueId> inputs) {
  if (!groups_.empty()) throw GraphError("nodes cannot be moved after fusion");
  Node moved = this->node(node);
  this->node(after);  // (throws for an unknown node)
  if (node == after) throw GraphError(fmt::format("move_after: node {} after itself", node));
  if (inputs.size() != moved.inputs.size())
    throw GraphError(fmt::format("move_after: node {} reads {} values, {} given", node, moved.inputs.size(), inputs.size()));
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Value &was = value(moved.inputs[i]), &now = value(inputs[i]);
    if (was.shape != now.shape || was.dtype != now.dtype)
      throw GraphError(fmt::format("move_after: node {} input {}: {} does not stand for {} (shape or dtype)", node, i,
                                   now.name, was.name));
  }
  // In the new order every other node keeps its place; the moved one follows `after`.
  for (ValueId in : inputs) {
    const NodeId producer = value(in).producer;
    if (producer == node || producer > after)
      throw GraphError(fmt::format("move_after: node {} would read {} before it is produced", node, value(in).name));
  }
  for (ValueId out : moved.outputs)
    for (NodeId reader : consumers(out))
      if (reader != node && reader <= after)
        throw GraphError(
            fmt::format("move_after: node {} would produce {} after its reader {}", node, value(out).name, reader));
  moved.inputs = std::move(inputs);
  const auto from = static_cast<std::size_t>(node);
  nodes_.erase(nodes_.begin() + static_cast<std::ptrdiff_t>(from));
  const std::size_t to = static_cast<std::size_t>(after) + (after < node ? 1 : 0);  // after the erase
  nodes_.insert(nodes_.begin() + static_cast<std::ptrdiff_t>(to), std::move(moved));
  renumber_from(std::min(from, to));
}

void Graph::renumber_from(std::size_t position) {
  for (std::size_t i = position; i < nodes_.size(); ++i) {
    nodes_[i].id = static_cast<NodeId>(i);
    for (ValueId out : nodes_[i].outputs) values_[static_cast<std::size_t>(out)].producer = nodes_[i].id;
  }
}

std::string Graph::unique_name(std::string base) const {
  if (!find_value(base)) return base;
  for (int i = 1;; ++i) {
    auto candidate = fmt::format("{}_{}", base, i);
    if (!find_value(candidate)) return candidate;
  }
}

const Value& Graph::value(ValueId id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= values_.size())
    throw GraphError(fmt::format("no value with id {}", id));
  return values_[static_cast<std::size_t>(id)];
}

const Node& Graph::node(NodeId id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= nodes_.size())
    throw GraphError(fmt::format("no node with id {}", id));
  return nodes_[static_cast<std::size_t>(id)];
}

std::optional<ValueId> Graph::find_value(std::string_view name) const {
  for (const auto& v : values_)
    if (v.name == name) return v.id;
  return std::nullopt;
}

ValueId Graph::value_named(std::string_view name) const {
  if (auto id = find_value(name)) return *id;
  throw GraphError(fmt::format("the graph has no value named '{}'", name));
}

std::vector<NodeId> Graph::consumers(ValueId id) const {
  std::vector<NodeId> out;
  for (const auto& n : nodes_)
    if (std::find(n.inputs.begin(), n.inputs.end(), id) != n.inputs.end()) out.push_back(n.id);
  return out;
}

std::vector<ValueId> Graph::values_with_role(Role role) const {
  std::vector<ValueId> out;
  for (const auto& v : values_)
    if (v.role == role) out.push_back(v.id);
  return out;
}

void Graph::mark_output(ValueId id) {
  value(id);
  if (std::find(outputs_.begin(), outputs_.end(), id) == outputs_.end()) outputs_.push_back(id);
}

void Graph::set_fusion_groups(std::vector<FusionGroup> groups) {
  for (auto& n : nodes_) n.fusion_group = -1;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    groups[g].id = static_cast<int>(g);
    for (NodeId n : groups[g].nodes) {
      auto& node = nodes_.at(static_cast<std::size_t>(n));
      if (node.fusion_group != -1)
        throw GraphError(fmt::format("node {} is in two fusion groups", n));
      node.fusion_group = static_cast<int>(g);
    }
  }
  groups_ = std::move(groups);
}

ValueId Graph::add_value_raw(Value v) {
  v.id = static_cast<ValueId>(values_.size());
  values_.push_back(std::move(v));
  return values_.back().id;
}

void Graph::add_node_raw(Node node) {
  node.id = static_cast<NodeId>(nodes_.size());
  nodes_.push_back(std::move(node));
}

}  // namespace sg
