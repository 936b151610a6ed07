#pragma once
// Softmax cross-entropy of one row by a warp or half a warp, and the batch's
// loss by one block (row_loss_by_thread, block_total). Shared by the loss
// kernel, the classifier head, the fused output-layer backward and the
// whole-network kernels (whole step, resident step, CNN step) so they round
// at the same points and give the same bits.
#include <cfloat>
#include <cstdint>

#include "ops/cuda/launch_config.cuh"
#include "ops/cuda/warp_reduce.cuh"

namespace sg::cuda {

// One row of softmax cross-entropy computed by an aligned group of `Lanes`
// lanes (lanes stride the columns); every lane of the warp must call it.
// Returns the row's loss (valid on the group's first lane). With `gradient`,
// also hands each dlogits[c] = (softmax - onehot) * inv_rows, in fp32, to
// `store(c, value)`, which rounds it as the caller's buffer holds it.
// kColsPerLane = 0 takes any number of columns (loops); n > 0 promises cols
// <= n * Lanes, and the loops unroll into n guarded steps (the whole-step
// kernel's lane per class).
// For cols <= 16 a 16-lane group gives the bits of the whole warp (Lanes =
// 32): there the first xor step only adds 0 / takes the max with -FLT_MAX.
// So does an 8-lane group: each lane first combines columns l and l + 8
// (0 + a + b is a + b), which is what the whole warp's second step adds.
template <int Lanes, int kColsPerLane = 0, typename T, typename Store>
__device__ __forceinline__ float softmax_xent_lanes_to(const T* row, std::int64_t cols, std::int32_t label,
                                                       float inv_rows, bool gradient, Store&& store) {
  const int lane = threadIdx.x % Lanes;
  const auto each_column = [&](auto&& f) {
    if constexpr (kColsPerLane > 0) {
#pragma unroll
      for (int i = 0; i < kColsPerLane; ++i)
        if (lane + std::int64_t(i) * Lanes < cols) f(lane + std::int64_t(i) * Lanes);
    } else {
      for (std::int64_t c = lane; c < cols; c += Lanes) f(c);
    }
  };
  float mx = -FLT_MAX;
  each_column([&](std::int64_t c) { mx = fmaxf(mx, to_float(row[c])); });
  mx = warp_max<Lanes>(mx);
  float sum = 0.f;
  each_column([&](std::int64_t c) { sum += __expf(to_float(row[c]) - mx); });
  sum = warp_sum<Lanes>(sum);
  if (gradient)
    each_column([&](std::int64_t c) {
      const float p = __expf(to_float(row[c]) - mx) / sum;
      store(c, (p - (c == label ? 1.f : 0.f)) * inv_rows);
    });
  return logf(sum) + mx - to_float(row[label]);
}

// The same with dlogits (when set) rounded to T.
template <int Lanes, typename T>
__device__ __forceinline__ float softmax_xent_lanes(const T* row, std::int64_t cols, std::int32_t label,
                                                    float inv_rows, T* dlogits) {
  return softmax_xent_lanes_to<Lanes>(row, cols, label, inv_rows, dlogits != nullptr,
                                      [=](std::int64_t c, float g) { dlogits[c] = from_float<T>(g); });
}

// Adds the per-warp partials in warp order and stores the result from thread 0.
template <int Warps, typename Out>
__device__ void block_total(float warp_partial, Out* out, float scale) {
  __shared__ float partials[Warps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) partials[warp] = warp_partial;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.f;
    for (int w = 0; w < Warps; ++w) total += partials[w];
    *out = static_cast<Out>(total * scale);
  }
}

// One row's loss by one thread: logsumexp - logit[label].
template <typename T>
__device__ float row_loss_by_thread(const T* row, std::int64_t cols, std::int32_t label) {
  float mx = -FLT_MAX;
#pragma unroll 4
  for (std::int64_t c = 0; c < cols; ++c) mx = fmaxf(mx, to_float(row[c]));
  float sum = 0.f;
#pragma unroll 4
  for (std::int64_t c = 0; c < cols; ++c) sum += __expf(to_float(row[c]) - mx);
  return logf(sum) + mx - to_float(row[label]);
}

// One row by the whole warp (returns the loss on lane 0).
template <typename T>
__device__ __forceinline__ float softmax_xent_row(const T* row, std::int64_t cols, std::int32_t label, float inv_rows,
                                                  T* dlogits) {
  return softmax_xent_lanes<32>(row, cols, label, inv_rows, dlogits);
}

}  // namespace sg::cuda
