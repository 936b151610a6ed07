#pragma once
// Host conversions between float and the 16-bit floating formats the GPU
// stores (IEEE half and bfloat16), each rounding to nearest even as CUDA's
// __float2half_rn / __float2bfloat16_rn do. The CPU reference backend rounds
// through these (runtime/cpu/cpu_executor.hpp); checkpoints convert with them.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "graph/dtype.hpp"

namespace sg {

inline std::uint16_t float_to_bf16_bits(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest, ties to even (overflow carries into inf)
  return static_cast<std::uint16_t>(bits >> 16);
}

inline float bf16_bits_to_float(std::uint16_t bits) {
  const std::uint32_t wide = static_cast<std::uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof value);
  return value;
}

// Rounds to the nearest IEEE half (ties to even) and back, in bit
// arithmetic: the compiler's _Float16 conversion is a library call here
// (~19 ns an element, a third of the CPU backend's fp16 run time); this is
// ~2 ns. tests/runtime/test_half_width_rounding.cpp checks it against
// _Float16 across the float range.
inline float round_to_f16(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) return value;  // inf and NaN stay
  if (magnitude >= 0x38800000u) {              // |x| >= 2^-14: a normal half, or overflow
    // Drop 13 of the 23 mantissa bits, ties to even; a carry moves into the exponent.
    std::uint32_t rounded = (magnitude + 0x0fffu + ((magnitude >> 13) & 1u)) & ~0x1fffu;
    if (rounded >= 0x47800000u) rounded = 0x7f800000u;  // 65520 and up round past 65504: infinity
    bits = (bits & 0x80000000u) | rounded;
    float out;
    std::memcpy(&out, &bits, sizeof out);
    return out;
  }
  // Subnormal halves are multiples of 2^-24, the ulp of floats in [0.5, 1):
  // adding 0.5 rounds |x| to that grid (nearest even), subtracting is exact.
  const float magnitude_f = std::fabs(value);
  return std::copysign((magnitude_f + 0.5f) - 0.5f, value);
}
inline float round_to_bf16(float value) { return bf16_bits_to_float(float_to_bf16_bits(value)); }

// `value` as a `dtype` element would hold it (f16, bf16; any other floating
// type keeps it). Doubles go through float first.
template <typename T>
T round_to_dtype(T value, DType dtype) {
  if (dtype == DType::f16) return static_cast<T>(round_to_f16(static_cast<float>(value)));
  if (dtype == DType::bf16) return static_cast<T>(round_to_bf16(static_cast<float>(value)));
  return value;
}

}  // namespace sg
