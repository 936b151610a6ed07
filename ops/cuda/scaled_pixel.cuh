#pragma once
// A dataset byte as the network reads it: its value times `scale` plus
// `shift` (data.normalize's affine map), rounded once to T. The batch fetch
// (batch_fetch.cu) and the few-channel forward's own fetch
// (fast_paths/few_channel_conv/) both write images through it, so a launch
// that fetches for itself gives the batch fetch's bits.
#include <cstdint>

#include "ops/cuda/launch_config.cuh"  // from_float

namespace sg::cuda {

template <typename T>
__device__ __forceinline__ T scaled_pixel(std::uint8_t byte, float scale, float shift) {
  return from_float<T>(float(byte) * scale + shift);
}

}  // namespace sg::cuda
