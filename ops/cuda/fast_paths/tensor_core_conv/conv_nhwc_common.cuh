#pragma once
// What the channels-last tensor-core convolutions (conv_nhwc_mma.cu,
// conv_nhwc_halo.cu, conv_nhwc_resident.cu) share: zero-filling 16-byte
// copies and the halo forms' store of a channel pair.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "ops/cuda/launch_config.cuh"  // to_float
#include "ops/cuda/mma_fragments.cuh"  // pack_floats

namespace sg::cuda::nhwc_conv {

// 16 bytes into shared memory, or 16 zero bytes where `valid` is false (the
// source is then not read).
__device__ __forceinline__ void copy16_or_zero(std::uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}

// Output channels col and col + 1 of the pixel at `out`: the two f32 sums [+ bias] [relu], rounded
// once, as one 4-byte store.
template <typename T>
__device__ __forceinline__ void store_channel_pair(T* out, int col, float v0, float v1, const T* bias, bool relu) {
  if (bias) {
    v0 += to_float(bias[col]);
    v1 += to_float(bias[col + 1]);
  }
  if (relu) {
    v0 = fmaxf(v0, 0.f);
    v1 = fmaxf(v1, 0.f);
  }
  *reinterpret_cast<std::uint32_t*>(out + col) = pack_floats<T>(v0, v1);
}

}  // namespace sg::cuda::nhwc_conv
