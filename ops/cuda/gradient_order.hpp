#pragma once
// How an update launch reads a convolution filter's gradient that a
// channels-last weight gradient wrote [O,KH,KW,C] (graph/filter_layout_pass.hpp)
// while the parameter, its state and the rest of the update are [O,C,KH,KW]:
// element i in the parameter's order is element index(i) of the gradient.
// The transpose back (a to_channels_first node) then costs no launch of its
// own. channels = 0: the gradient is read as it is.
#include <cstdint>

#if defined(__CUDACC__)
#define SG_GRADIENT_ORDER_HD __host__ __device__
#else
#define SG_GRADIENT_ORDER_HD
#endif

namespace sg::cuda {

struct GradientOrder {
  std::int32_t channels = 0;  // C of [O,KH,KW,C]
  std::int32_t taps = 0;      // KH * KW

  SG_GRADIENT_ORDER_HD bool permuted() const { return channels > 0; }
  // Element i of [O,C,KH,KW] (o, c, tap) is element (o, tap, c) of [O,KH,KW,C].
  // A filter's elements fit 32 bits (a conv's filter is [O,C,KH,KW] of a few
  // million at most): its divisions are the 32-bit ones, a few instructions
  // each, not the 64-bit ones' software loop (an update reads every element).
  SG_GRADIENT_ORDER_HD std::int64_t index(std::int64_t i) const {
    if (channels == 0) return i;
    const auto at = static_cast<std::uint32_t>(i), ch = static_cast<std::uint32_t>(channels),
               tp = static_cast<std::uint32_t>(taps);
    const std::uint32_t o = at / (ch * tp), rest = at - o * ch * tp;
    const std::uint32_t c = rest / tp, tap = rest - c * tp;
    return (std::int64_t(o) * tp + tap) * ch + c;
  }
};

}  // namespace sg::cuda
