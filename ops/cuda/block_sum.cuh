#pragma once
// The sum of a value over every thread of a block of Threads threads (a
// multiple of 32), returned in every thread: a butterfly within each warp,
// then the warps' sums added in warp order, so equal inputs give equal bits.
// `shared` holds one float per warp; the call ends with a barrier, so the
// next one may reuse it. Shared by the row / channel normalisation kernels.
#include "ops/cuda/warp_reduce.cuh"

namespace sg::cuda {

template <int Threads>
__device__ __forceinline__ float block_sum(float v, float* shared) {
  static_assert(Threads % 32 == 0, "whole warps");
  v = warp_sum(v);
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < Threads / 32; ++w) total += shared[w];
  __syncthreads();
  return total;
}

}  // namespace sg::cuda
