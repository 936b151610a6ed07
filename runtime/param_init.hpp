#pragma once
// Initial parameter values (PyTorch nn.Linear's scheme, from the project's
// counter-based RNG so bench/ scripts can reproduce them exactly).
#include <cstdint>
#include <string>
#include <vector>

#include "graph/mlp_builder.hpp"

namespace sg {

struct NamedValues {
  std::string name;
  Shape shape;
  std::vector<float> values;
};

// w1, b1, w2, b2, ... with parameter index 2l / 2l+1 and fan_in = layers[l].
std::vector<NamedValues> initial_parameters(const std::vector<std::int64_t>& layers, std::uint64_t seed);

}  // namespace sg
