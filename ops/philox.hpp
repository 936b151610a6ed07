#pragma once
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC'11; the generator behind curand's and PyTorch's CUDA Philox): a
// counter-based RNG, so element i of step s draws its bits from (key,
// counter) alone, with no state to carry between launches. One definition
// for the CPU reference (ops/cpu/reference_ops.hpp) and the CUDA kernels
// (ops/cuda/dropout.cu), so both backends draw the same bits.
#include <cstdint>

#if defined(__CUDACC__)
#define SG_PHILOX_HD __host__ __device__
#else
#define SG_PHILOX_HD
#endif

namespace sg::philox {

struct Bits4 {
  std::uint32_t v[4];
};

SG_PHILOX_HD inline void mul_hi_lo(std::uint32_t a, std::uint32_t b, std::uint32_t& hi, std::uint32_t& lo) {
  const std::uint64_t p = static_cast<std::uint64_t>(a) * b;
  hi = static_cast<std::uint32_t>(p >> 32);
  lo = static_cast<std::uint32_t>(p);
}

// Random123's philox4x32_R(10, counter, key).
SG_PHILOX_HD inline Bits4 philox4x32_10(Bits4 ctr, std::uint32_t key0, std::uint32_t key1) {
  constexpr std::uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // multipliers
  constexpr std::uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // Weyl key increments
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key0 += kW0;
      key1 += kW1;
    }
    std::uint32_t hi0, lo0, hi1, lo1;
    mul_hi_lo(kM0, ctr.v[0], hi0, lo0);
    mul_hi_lo(kM1, ctr.v[2], hi1, lo1);
    ctr = Bits4{{hi1 ^ ctr.v[1] ^ key0, lo1, hi0 ^ ctr.v[3] ^ key1, lo0}};
  }
  return ctr;
}

// Dropout's keep bit for element `element` of dropout site `stream` at
// training step `step`: counter words (element / 4 low 32 bits, stream, step,
// element / 4 high 32 bits), key = seed (low word, high word),
// word element % 4 of the block as a uniform u in [0, 1) with 24 bits; kept
// when u >= p (probability 1 - p). `threshold` is p * 2^24 rounded up
// (dropout_threshold), so the test is an integer compare on both backends.
SG_PHILOX_HD inline std::uint32_t dropout_threshold(double p) {
  const double t = p * 16777216.0;
  const auto floor_t = static_cast<std::uint32_t>(t);
  return static_cast<double>(floor_t) == t ? floor_t : floor_t + 1u;
}

// The bits of elements 4 block .. 4 block + 3 (one Philox call serves four).
SG_PHILOX_HD inline Bits4 dropout_bits(std::uint64_t seed, std::int64_t stream, std::int32_t step,
                                       std::uint64_t block) {
  const Bits4 ctr{{static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(stream),
                   static_cast<std::uint32_t>(step), static_cast<std::uint32_t>(block >> 32)}};
  return philox4x32_10(ctr, static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
}

SG_PHILOX_HD inline bool keep_bit(std::uint32_t word, std::uint32_t threshold) { return (word >> 8) >= threshold; }

SG_PHILOX_HD inline bool dropout_keep(std::uint64_t seed, std::int64_t stream, std::int32_t step, std::int64_t element,
                                      std::uint32_t threshold) {
  const Bits4 r = dropout_bits(seed, stream, step, static_cast<std::uint64_t>(element) >> 2);
  return keep_bit(r.v[element & 3], threshold);
}

}  // namespace sg::philox
