#pragma once
// What the channels-last tensor-core convolutions (conv_nhwc_mma.cu,
// conv_nhwc_halo.cu) share: zero-filling 16-byte copies (the epilogue packs
// channel pairs with mma_fragments.cuh's pack_floats).
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

}  // namespace sg::cuda::nhwc_conv
