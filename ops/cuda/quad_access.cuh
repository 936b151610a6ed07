#pragma once
// Four consecutive elements moved as one vector access: 8 bytes for a 2-byte
// type (half, bfloat16), 16 for float. The caller guarantees the alignment.
// Shared by the update-rule kernels (update_rules/multi_tensor_update.cu,
// fast_paths/fused_update/wgrad_update.cu), which read and write W, m and v four at a time.
#include <cstring>

namespace sg::cuda {

template <typename T>
struct Quad {
  T v[4];
};

template <typename T>
__device__ __forceinline__ Quad<T> load_quad(const T* p) {
  Quad<T> q;
  if constexpr (sizeof(T) == 2) {
    const uint2 raw = *reinterpret_cast<const uint2*>(p);
    memcpy(&q, &raw, sizeof raw);
  } else {
    const float4 raw = *reinterpret_cast<const float4*>(p);
    memcpy(&q, &raw, sizeof raw);
  }
  return q;
}

template <typename T>
__device__ __forceinline__ void store_quad(T* p, const Quad<T>& q) {
  if constexpr (sizeof(T) == 2) {
    uint2 raw;
    memcpy(&raw, &q, sizeof raw);
    *reinterpret_cast<uint2*>(p) = raw;
  } else {
    float4 raw;
    memcpy(&raw, &q, sizeof raw);
    *reinterpret_cast<float4*>(p) = raw;
  }
}

}  // namespace sg::cuda
