#pragma once
// Initial parameter values from the project's counter-based RNG
// (runtime/random.hpp), so the PyTorch scripts in bench/ reproduce them
// exactly (bench/stepgraph_data.py implements the same functions).
#include <cstdint>
#include <vector>

#include "runtime/random.hpp"

namespace sg {

// Key of parameter `index` (0-based, in the model's parameter order) for `seed`.
constexpr std::uint64_t param_key(std::uint64_t seed, std::uint64_t index) {
  return splitmix64_mix(seed) ^ (0xD1B54A32D192ED03ull * (index + 1));
}

// PyTorch nn.Linear's default scheme: every weight and bias of a layer with
// `fan_in` inputs is U(-1/sqrt(fan_in), 1/sqrt(fan_in)); element i is
// (2 * stream_uniform(key, i) - 1) / sqrt(fan_in).
std::vector<float> linear_init(std::int64_t count, std::int64_t fan_in, std::uint64_t key);

}  // namespace sg
