#include "runtime/random.hpp"

#include <numeric>
#include <utility>

namespace sg {

std::vector<std::int32_t> epoch_permutation(std::int64_t n, std::uint64_t seed, std::uint64_t epoch) {
  std::vector<std::int32_t> perm(static_cast<std::size_t>(n));
  std::iota(perm.begin(), perm.end(), 0);
  const auto key = epoch_key(seed, epoch);
  for (std::int64_t i = n - 1; i >= 1; --i) {
    const auto j = static_cast<std::int64_t>(stream_u64(key, static_cast<std::uint64_t>(n - 1 - i)) %
                                             static_cast<std::uint64_t>(i + 1));
    std::swap(perm[static_cast<std::size_t>(i)], perm[static_cast<std::size_t>(j)]);
  }
  return perm;
}

}  // namespace sg
