#include "models/param_init.hpp"

#include <cmath>

namespace sg {

std::vector<float> linear_init(std::int64_t count, std::int64_t fan_in, std::uint64_t key) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  std::vector<float> out(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i)
    out[static_cast<std::size_t>(i)] =
        static_cast<float>((2.0 * stream_uniform(key, static_cast<std::uint64_t>(i)) - 1.0) * bound);
  return out;
}

}  // namespace sg
