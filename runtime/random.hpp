#pragma once
// The project's only randomness: counter-based SplitMix64 streams, so that the
// PyTorch scripts in bench/ reproduce the same permutations and initial
// weights (bench/stepgraph_data.py implements the same functions). The
// parameter keys and nn.Linear's scheme are the model builders'
// (models/param_init.hpp); the header part here is all they use.
#include <cstdint>
#include <vector>

namespace sg {

constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ull;

// The SplitMix64 output function.
constexpr std::uint64_t splitmix64_mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Element i of the stream with key `key`: mix(key + (i + 1) * golden).
constexpr std::uint64_t stream_u64(std::uint64_t key, std::uint64_t i) {
  return splitmix64_mix(key + (i + 1) * kGolden);
}

// Uniform in [0, 1) from the top 53 bits.
inline double stream_uniform(std::uint64_t key, std::uint64_t i) {
  return static_cast<double>(stream_u64(key, i) >> 11) * 0x1.0p-53;
}

// Key of epoch `epoch`'s permutation for shuffle seed `seed`.
constexpr std::uint64_t epoch_key(std::uint64_t seed, std::uint64_t epoch) {
  return splitmix64_mix(seed + 0x5851F42D4C957F2Dull) ^ (0xD1B54A32D192ED03ull * (epoch + 1));
}

// Fisher-Yates over 0..n-1: for i = n-1 down to 1, j = stream_u64(key, n-1-i) mod (i+1), swap.
std::vector<std::int32_t> epoch_permutation(std::int64_t n, std::uint64_t seed, std::uint64_t epoch);

}  // namespace sg
