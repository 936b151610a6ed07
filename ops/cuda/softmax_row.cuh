#pragma once
// One row of softmax cross-entropy, computed by one warp (lanes stride the
// columns). Shared by the loss kernel and the fused output-layer backward so
// both round at the same points and give the same bits.
#include <cfloat>
#include <cstdint>

#include "ops/cuda/launch_config.cuh"

namespace sg::cuda {

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Returns the row's loss (valid on lane 0). With dlogits set, also writes
// dlogits[c] = (softmax - onehot) * inv_rows, rounded to T.
template <typename T>
__device__ __forceinline__ float softmax_xent_row(const T* row, std::int64_t cols, std::int32_t label, float inv_rows,
                                                  T* dlogits) {
  const int lane = threadIdx.x % 32;
  float mx = -FLT_MAX;
  for (std::int64_t c = lane; c < cols; c += 32) mx = fmaxf(mx, to_float(row[c]));
  mx = warp_max(mx);
  float sum = 0.f;
  for (std::int64_t c = lane; c < cols; c += 32) sum += __expf(to_float(row[c]) - mx);
  sum = warp_sum(sum);
  if (dlogits)
    for (std::int64_t c = lane; c < cols; c += 32) {
      const float p = __expf(to_float(row[c]) - mx) / sum;
      dlogits[c] = from_float<T>((p - (c == label ? 1.f : 0.f)) * inv_rows);
    }
  return logf(sum) + mx - to_float(row[label]);
}

}  // namespace sg::cuda
