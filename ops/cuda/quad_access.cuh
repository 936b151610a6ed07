#pragma once
// Four consecutive elements moved as one vector access: 8 bytes for a 2-byte
// type (half, bfloat16), 16 for float (packed_access.cuh's accesses, whose
// alignment the caller guarantees). Shared by the update-rule kernels
// (update_rules/multi_tensor_update.cu, fast_paths/fused_update/wgrad_update.cu),
// which read and write W, m and v four at a time.
#include "ops/cuda/packed_access.cuh"

namespace sg::cuda {

template <typename T>
struct Quad {
  T v[4];
};

template <typename T>
__device__ __forceinline__ Quad<T> load_quad(const T* p) {
  Quad<T> q;
  load_packed<4 * int(sizeof(T))>(p, q.v);
  return q;
}

template <typename T>
__device__ __forceinline__ void store_quad(T* p, const Quad<T>& q) {
  store_packed<4 * int(sizeof(T))>(p, q.v);
}

}  // namespace sg::cuda
