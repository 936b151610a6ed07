#pragma once
// The op graph: values plus nodes kept in a valid execution order. Builder
// methods infer output shapes and throw GraphError naming op and shapes
// (GraphError is declared in graph/op.hpp).
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "graph/op.hpp"
#include "graph/value.hpp"

namespace sg {

class Graph {
 public:
  // ---- graph-owned values
  ValueId input(std::string name, Shape shape, DType dtype);
  ValueId label(std::string name, Shape shape, DType dtype);
  ValueId param(std::string name, Shape shape, DType dtype);
  ValueId state(std::string name, Shape shape, DType dtype);

  // ---- builder ops (each appends one node, returns its output)
  // rank/ranks: a data-parallel rank's slice of the global batch (BatchIndicesAttrs).
  ValueId batch_indices(ValueId perm, ValueId step, std::int64_t batch, std::int64_t rank = 0, std::int64_t ranks = 1);
  ValueId gather_rows(ValueId table, ValueId indices, DType out_dtype, double scale = 1.0,
                      double shift = 0.0, std::string name = {});
  ValueId matmul(ValueId a, ValueId b, bool trans_a = false, bool trans_b = false);
  ValueId bias_add(ValueId x, ValueId bias);
  ValueId linear(ValueId x, ValueId weight_out_in, ValueId bias);  // x W^T + b
  ValueId relu(ValueId x);
  ValueId relu_backward(ValueId grad_out, ValueId relu_out);
  ValueId softmax_xent(ValueId logits, ValueId labels);
  ValueId softmax_xent_backward(ValueId logits, ValueId labels);
  ValueId reduce_rows(ValueId x);
  ValueId add(ValueId a, ValueId b);
  ValueId cast(ValueId x, DType to);
  ValueId count_correct(ValueId logits, ValueId labels);
  ValueId gelu(ValueId x);
  ValueId gelu_backward(ValueId grad_out, ValueId x);
  // Two outputs: {Z = x + bias, relu(Z)}.
  std::vector<ValueId> bias_add_relu(ValueId x, ValueId bias);
  // The learning rate is not part of the IR: executors hold it as run state.
  void sgd_update(ValueId param, ValueId grad, double momentum = 0.0, double weight_decay = 0.0,
                  std::optional<ValueId> velocity = std::nullopt);
  void advance_step(ValueId step);

  // ---- convolutional networks (issue 22); values are NCHW (see Conv2dAttrs)
  // x [N,C,H,W], w [O,C,KH,KW], bias [O] -> [N,O,(H+2p-KH)/s+1,(W+2p-KW)/s+1].
  ValueId conv2d(ValueId x, ValueId w, std::optional<ValueId> bias, int stride, int padding);
  ValueId max_pool2d(ValueId x, int kernel, int stride);  // -> [N,C,(H-k)/s+1,(W-k)/s+1]
  ValueId flatten(ValueId x);                             // [N, ...] -> [N, prod(...)]
  ValueId reshape(ValueId x, Shape shape);
  // PyTorch's Dropout2d: whole channels, dropout's Philox bits keyed on
  // (seed, stream, the step counter `step` i32[1], n * C + c).
  ValueId dropout2d(ValueId x, double p, ValueId step, std::uint64_t seed, std::int64_t stream);

  // Generic append / insert used by the builders and the passes. Output
  // shapes come from shape inference; `output_role` and `name` label them.
  std::vector<ValueId> append_node(OpKind op, std::vector<ValueId> inputs, OpAttrs attrs,
                                   Role output_role = Role::activation, std::string name = {});
  std::vector<ValueId> insert_node(std::size_t position, OpKind op, std::vector<ValueId> inputs,
                                   OpAttrs attrs, Role output_role, std::string name);
  // Moves node `node` to run right after node `after`, reading `inputs` in
  // place of its own (each of the same shape and dtype, so its outputs keep
  // their ids, shapes and readers). Throws GraphError when an input would be
  // read before it is produced or an output after one of its readers.
  void move_after(NodeId node, NodeId after, std::vector<ValueId> inputs);
  // Gives node `node` new attributes of its op's kind, which must leave its
  // outputs' shapes and dtypes as they are (a loss gradient's scale, issue
  // 38). Throws GraphError otherwise, or after fusion.
  void set_attrs(NodeId node, OpAttrs attrs);
  // Node `reader` reads `now` wherever it read `was` (of the same shape and
  // dtype: a gathered parameter in place of the parameter, issue 38). Throws
  // GraphError otherwise, when `now` would be read before it is produced, or
  // after fusion.
  void read_instead(NodeId reader, ValueId was, ValueId now);
  // Node `node` reads `inputs` with `attrs` (of its op's kind), which must
  // leave its outputs' shapes and dtypes as they are (a convolution reading
  // its filter in another layout). Throws GraphError otherwise, when an input
  // would be read before it is produced, or after fusion.
  void rewire(NodeId node, std::vector<ValueId> inputs, OpAttrs attrs);

  // ---- queries
  const Value& value(ValueId id) const;
  const Node& node(NodeId id) const;
  const std::vector<Value>& values() const { return values_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<FusionGroup>& fusion_groups() const { return groups_; }
  std::optional<ValueId> find_value(std::string_view name) const;
  ValueId value_named(std::string_view name) const;  // throws GraphError
  std::vector<NodeId> consumers(ValueId id) const;
  std::vector<ValueId> values_with_role(Role role) const;

  // Outputs the caller wants to read after a run (loss, accuracy count).
  void mark_output(ValueId id);
  const std::vector<ValueId>& outputs() const { return outputs_; }

  // ---- used by passes and deserialisation
  void set_fusion_groups(std::vector<FusionGroup> groups);
  ValueId add_value_raw(Value value);  // id is assigned; producer kept
  void add_node_raw(Node node);        // id is assigned; nothing inferred

  bool operator==(const Graph&) const = default;

 private:
  ValueId add_owned(std::string name, Shape shape, DType dtype, Role role);
  std::string unique_name(std::string base) const;
  void renumber_from(std::size_t position);
  // Throws (naming `who`) unless node `node` reading `inputs` with `attrs`
  // gives the outputs it has (set_attrs, rewire).
  void expect_same_outputs(std::string_view who, NodeId node, const std::vector<ValueId>& inputs,
                           const OpAttrs& attrs) const;

  std::vector<Value> values_;
  std::vector<Node> nodes_;
  std::vector<FusionGroup> groups_;
  std::vector<ValueId> outputs_;
};

}  // namespace sg
