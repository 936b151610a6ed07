#pragma once
// The random choices of issue 37's training-batch augmentation, one
// definition for the CPU reference and the CUDA kernel (as ops/philox.hpp's
// dropout bits): example `example` (its index in the global batch) at step
// `step` draws one Philox4x32-10 block with counter (example low word,
// kAugmentStream, step, example high word) and key seed; word 0 gives the
// vertical shift, word 1 the horizontal one, each uniform in [-translate,
// translate] (word mod (2 translate + 1): a bias below 2^-24 for any shift
// a 2^31-pixel image allows), and the top bit of word 2 the flip.
#include <cstdint>

#include "ops/philox.hpp"

namespace sg::augment {

// Dropout sites use counter word 1 for stream k + (n << 16), k a layer
// index: this value is out of their reach.
constexpr std::uint32_t kAugmentStream = 0xA0600000u;

struct Draw {
  std::int32_t dy = 0, dx = 0;  // the image moves down dy rows and right dx columns
  bool flip = false;            // mirrored left-right before the move
};

SG_PHILOX_HD inline Draw draw(std::uint64_t seed, std::int32_t step, std::int64_t example, std::int64_t translate,
                              bool flip) {
  const auto e = static_cast<std::uint64_t>(example);
  const philox::Bits4 r = philox::philox4x32_10(
      philox::Bits4{{static_cast<std::uint32_t>(e), kAugmentStream, static_cast<std::uint32_t>(step),
                     static_cast<std::uint32_t>(e >> 32)}},
      static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
  const auto span = static_cast<std::uint32_t>(2 * translate + 1);
  Draw d;
  d.dy = static_cast<std::int32_t>(r.v[0] % span) - static_cast<std::int32_t>(translate);
  d.dx = static_cast<std::int32_t>(r.v[1] % span) - static_cast<std::int32_t>(translate);
  d.flip = flip && (r.v[2] >> 31) != 0;
  return d;
}

// The source column of output column j of a `w`-wide image under `d`, or -1
// when it comes from outside (filled).
SG_PHILOX_HD inline std::int64_t source_col(const Draw& d, std::int64_t j, std::int64_t w) {
  const std::int64_t moved = j - d.dx;
  if (moved < 0 || moved >= w) return -1;
  return d.flip ? w - 1 - moved : moved;
}
SG_PHILOX_HD inline std::int64_t source_row(const Draw& d, std::int64_t i, std::int64_t h) {
  const std::int64_t moved = i - d.dy;
  return moved < 0 || moved >= h ? -1 : moved;
}

}  // namespace sg::augment
