#pragma once
// Launch geometry and 16-byte vector access shared by our element-wise kernels.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace sg::cuda {

constexpr int kThreads = 256;

inline unsigned blocks_for(std::int64_t work, int per_block = kThreads) {
  const std::int64_t b = (work + per_block - 1) / per_block;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 8 ? 65535 * 8 : b));
}

// Elements of T in one 16-byte access.
template <typename T>
constexpr int kVec = 16 / sizeof(T);

template <typename T>
struct alignas(16) Vec16 {
  T v[kVec<T>];
};

inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

}  // namespace sg::cuda
