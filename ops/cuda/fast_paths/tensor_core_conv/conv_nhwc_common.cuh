#pragma once
// What the channels-last tensor-core convolutions (conv_nhwc_mma.cu,
// conv_nhwc_halo.cu) share: zero-filling 16-byte copies and the epilogue's
// packing of two adjacent channels.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace sg::cuda::nhwc_conv {

// 16 bytes into shared memory, or 16 zero bytes where `valid` is false (the
// source is then not read).
__device__ __forceinline__ void copy16_or_zero(std::uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}

template <typename T>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&v);
  } else {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&v);
  }
}

}  // namespace sg::cuda::nhwc_conv
