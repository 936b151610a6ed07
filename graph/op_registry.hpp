#pragma once
// The op registry: everything an op kind is, defined in one place. Each op
// (or small family, e.g. relu + relu_backward) has one file under graph/ops/
// returning its OpDef; op_registry.cpp lists them in an explicit table (no
// static-initialisation registration: static libraries drop unreferenced
// objects). op_name/op_from_name/in_place_inputs, shape inference, autodiff,
// the dumps and the CPU executor all dispatch through op_def().
//
// Adding an element-wise op: an OpKind, a graph/ops/<op>.cpp with its OpDef,
// one line in op_registry.cpp's table, its reference in
// ops/cpu/reference_ops.hpp, a builder in graph.hpp if wanted, a test.
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "graph/graph.hpp"
#include "graph/shape_inference.hpp"

namespace sg {

// ---- gradient rules
//
// A rule sees the gradients of ALL the node's outputs (nullopt where an
// output does not reach the loss; at least one is set) and contributes
// gradients for the inputs that need one. Nodes it appends should be named
// grad_name(...) and get Role::grad (emit() does both).
class GradientContext {
 public:
  using Sink = std::function<void(ValueId value, ValueId grad)>;
  GradientContext(Graph& graph, const Node& node, std::vector<std::optional<ValueId>> output_grads,
                  std::vector<bool> input_needs_grad, Sink contribute);

  Graph& graph() const { return graph_; }
  const Node& node() const { return node_; }
  ValueId input(int slot) const;
  ValueId output(int slot) const;
  // One entry per output of the node.
  const std::vector<std::optional<ValueId>>& output_grads() const { return output_grads_; }
  std::optional<ValueId> output_grad(int slot) const;
  bool needs_grad(int input_slot) const;
  std::string grad_name(ValueId value) const;  // "grad_<value name>"
  // Appends `op` with Role::grad outputs named grad_name(named_after); returns its outputs.
  std::vector<ValueId> emit(OpKind op, std::vector<ValueId> inputs, OpAttrs attrs, ValueId named_after) const;
  // Adds `grad` to input `slot`'s gradient (an `add` node when it has one already).
  void contribute(int input_slot, ValueId grad) const;

 private:
  Graph& graph_;
  const Node& node_;
  std::vector<std::optional<ValueId>> output_grads_;
  std::vector<bool> needs_;
  Sink sink_;
};

using GradientRule = void (*)(const GradientContext&);

// ---- CPU reference
//
// Views of the executor's host tensors (floating values in the compute type
// T, whatever their graph dtype).
template <typename T>
struct CpuTensor {
  DType dtype = DType::f32;
  std::int64_t size = 0;  // elements
  std::int64_t rows = 1;  // shape[0] (1 for a scalar)
  std::int64_t cols = 1;  // shape[1] (1 below rank 2)
  T* real = nullptr;
  std::int32_t* i32 = nullptr;
  std::uint8_t* u8 = nullptr;
  std::span<const std::int64_t> shape;  // the value's full shape (conv and pooling need H, W)
};

template <typename T>
struct CpuCall {
  const Node& node;
  std::span<const CpuTensor<T>> in;   // one per input
  std::span<const CpuTensor<T>> out;  // one per output
  std::optional<double> learning_rate;  // the optimizer's scalar (sgd_update), if set
};

template <typename T>
using CpuKernel = void (*)(const CpuCall<T>&);

// ---- the entry
using ShapeRule = std::vector<OutputSpec> (*)(const std::vector<const Value*>& inputs, const OpAttrs& attrs);

struct OpDef {
  OpKind kind = OpKind::add;
  std::string_view name;     // dump name, JSON "op"
  std::size_t attrs_index = 0;  // the OpAttrs alternative the op takes (attrs_index<A>())
  nlohmann::json (*attrs_to_json)(const OpAttrs&) = nullptr;  // the op's fields only
  OpAttrs (*attrs_from_json)(const nlohmann::json&) = nullptr;  // throws nlohmann::json::exception
  std::string (*attrs_text)(const OpAttrs&) = nullptr;  // " {k=v,...}" or "" (text and DOT dumps)
  ShapeRule infer = nullptr;  // called with attrs of the op's kind; throws GraphError
  GradientRule gradient = nullptr;  // null: no gradient rule (backward-only or integer ops)
  // Non-null: the op can be the loss (scalar output); emits the input
  // gradients given an implicit dLoss = 1 (output_grads() are all nullopt).
  GradientRule loss_gradient = nullptr;
  // Non-null: no outputs, writes these inputs (from the node's attributes and input count).
  std::vector<int> (*in_place)(const OpAttrs& attrs, int input_count) = nullptr;
  CpuKernel<float> cpu_f32 = nullptr;
  CpuKernel<double> cpu_f64 = nullptr;

  bool is_loss() const { return loss_gradient != nullptr; }
  template <typename T>
  CpuKernel<T> cpu() const {
    if constexpr (std::is_same_v<T, float>) return cpu_f32;
    else return cpu_f64;
  }
};

// The entry of `op`; throws GraphError for a value outside the enum.
const OpDef& op_def(OpKind op);
// Every entry, in OpKind order.
std::span<const OpDef* const> all_op_defs();
// op's attributes as JSON / back (checks the kind against the op's).
nlohmann::json attrs_to_json(OpKind op, const OpAttrs& attrs);
OpAttrs attrs_from_json(OpKind op, const nlohmann::json& j);
// op's attributes for the text and DOT dumps (" {k=v,...}" or ""); attributes
// of the wrong kind print as " {<kind> attributes?}".
std::string attrs_text(OpKind op, const OpAttrs& attrs);

}  // namespace sg
