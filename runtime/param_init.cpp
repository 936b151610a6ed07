#include "runtime/param_init.hpp"

#include "runtime/random.hpp"

namespace sg {

std::vector<NamedValues> initial_parameters(const std::vector<std::int64_t>& layers, std::uint64_t seed) {
  std::vector<NamedValues> out;
  for (std::size_t l = 1; l < layers.size(); ++l) {
    const auto in = layers[l - 1], units = layers[l];
    const auto index = static_cast<std::uint64_t>(2 * (l - 1));
    out.push_back({names::weight(l), {units, in}, linear_init(units * in, in, param_key(seed, index))});
    out.push_back({names::bias(l), {units}, linear_init(units, in, param_key(seed, index + 1))});
  }
  return out;
}

}  // namespace sg
