#pragma once
// Shared helpers of the runtime tests: fresh random fills (the seed is
// printed on failure) and relative error by norm.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <vector>

namespace sg::test {

// The seed of the latest fresh_rng(), for INFO() in the calling test.
inline unsigned& last_seed() {
  static unsigned seed = 0;
  return seed;
}

// A new random seed per call; SG_TEST_SEED=<n> replays a failure's seed.
inline std::mt19937_64 fresh_rng() {
  const char* fixed = std::getenv("SG_TEST_SEED");
  last_seed() = fixed ? static_cast<unsigned>(std::strtoul(fixed, nullptr, 10)) : std::random_device{}();
  return std::mt19937_64(last_seed());
}

// A uniform integer in [lo, hi] (the random shapes of the GPU tests).
inline std::int64_t pick(std::mt19937_64& rng, std::int64_t lo, std::int64_t hi) {
  return lo + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(hi - lo + 1));
}

template <typename T>
void fill_uniform(std::vector<T>& v, std::mt19937_64& rng, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> dist(lo, hi);
  for (auto& x : v) x = static_cast<T>(dist(rng));
}

// ||a - b|| / ||b||; infinite when anything is NaN so NaN never passes.
template <typename A, typename B>
double relative_error(const std::vector<A>& a, const std::vector<B>& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double x = static_cast<double>(a[i]), y = static_cast<double>(b[i]);
    if (!std::isfinite(x) || !std::isfinite(y)) return INFINITY;
    diff += (x - y) * (x - y);
    ref += y * y;
  }
  return ref == 0 ? std::sqrt(diff) : std::sqrt(diff / ref);
}

}  // namespace sg::test
