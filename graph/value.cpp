#include "graph/value.hpp"

#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace sg {

std::string_view role_name(Role role) {
  switch (role) {
    case Role::input: return "input";
    case Role::label: return "label";
    case Role::param: return "param";
    case Role::state: return "state";
    case Role::activation: return "activation";
    case Role::grad: return "grad";
  }
  return "?";
}

Role role_from_name(std::string_view name) {
  for (Role r : {Role::input, Role::label, Role::param, Role::state, Role::activation, Role::grad})
    if (role_name(r) == name) return r;
  throw std::invalid_argument(fmt::format("unknown role '{}'", name));
}

bool is_graph_owned(Role role) {
  return role == Role::input || role == Role::label || role == Role::param || role == Role::state;
}

std::int64_t element_count(const Shape& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::size_t value_bytes(const Value& v) { return static_cast<std::size_t>(element_count(v.shape)) * dtype_size(v.dtype); }

std::string shape_string(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ",")); }

}  // namespace sg
