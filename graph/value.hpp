#pragma once
// A typed tensor value of the op graph: defined once, by one node or by the
// graph itself (inputs, labels, parameters, optimizer state).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "graph/dtype.hpp"

namespace sg {

using Shape = std::vector<std::int64_t>;
using ValueId = int;
using NodeId = int;

// What a value is for. input/label/param/state values are owned by the graph
// (no producer); activation/grad values are produced by exactly one node.
enum class Role : std::uint8_t { input, label, param, state, activation, grad };

std::string_view role_name(Role role);
Role role_from_name(std::string_view name);  // throws std::invalid_argument
bool is_graph_owned(Role role);              // true when no node may produce it

struct Value {
  ValueId id = -1;
  std::string name;
  Shape shape;
  DType dtype = DType::f32;
  Role role = Role::activation;
  NodeId producer = -1;  // -1 for graph-owned values

  bool operator==(const Value&) const = default;
};

std::int64_t element_count(const Shape& shape);
std::size_t value_bytes(const Value& v);  // element_count(shape) * dtype_size(dtype)
std::string shape_string(const Shape& shape);  // "[32,784]"

}  // namespace sg
