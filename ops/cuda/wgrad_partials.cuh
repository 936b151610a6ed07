#pragma once
// The second pass of a weight gradient computed as ordered per-block f32
// partials (the direct convolution's, conv_direct_wgrad.cu, and the
// few-channel convolution's, fast_paths/few_channel_conv): each element is
// the sum of its partials in a fixed order, so every run gives the same bits.
#include "ops/cuda/launch_config.cuh"

namespace sg::cuda {

// Part groups a block: warp w of a block adds parts w, w + kFinishGroups, ...
inline constexpr int kFinishGroups = 16;

// Element e = o * outs + k of the partials [parts][elements] is dw[o][k]
// (k < taps) or db[o] (k == taps, with the bias): the sum of its `parts`
// partials. A block takes 32 consecutive elements, one a lane, so each load
// of a warp is 128 contiguous bytes of one part (a warp per element, as
// before, read 32 parts' rows at once: a sector a lane, 5.6 us for 320 x 640
// partials in ncu); its warps add their parts in order and then pairwise in
// a fixed tree. db is rounded to T, then widened when B is float (the
// graph's T sum and its cast).
template <typename T, typename B>
__global__ void __launch_bounds__(32 * kFinishGroups)
    wgrad_partials_finish(const float* partials, int parts, int elements, int outs, int taps, T* dw, B* db) {
  __shared__ float sums[kFinishGroups][32];
  const int lane = int(threadIdx.x) % 32, group = int(threadIdx.x) / 32, e = int(blockIdx.x) * 32 + lane;
  float v = 0.f;
  if (e < elements)
#pragma unroll 8
    for (int q = group; q < parts; q += kFinishGroups) v += partials[std::int64_t(q) * elements + e];
  sums[group][lane] = v;
  for (int half = kFinishGroups / 2; half >= 1; half /= 2) {
    __syncthreads();
    if (group < half) sums[group][lane] = v = v + sums[group + half][lane];
  }
  if (group != 0 || e >= elements) return;
  const int o = e / outs, k = e - o * outs;
  if (k < taps) dw[o * taps + k] = from_float<T>(v);
  else db[o] = from_float<B>(to_float(from_float<T>(v)));
}

// The launch: a block per 32 elements.
template <typename T, typename B>
void launch_wgrad_partials_finish(const float* partials, int parts, int elements, int outs, int taps, T* dw, B* db,
                                  cudaStream_t stream) {
  wgrad_partials_finish<T, B><<<(elements + 31) / 32, 32 * kFinishGroups, 0, stream>>>(partials, parts, elements, outs,
                                                                                      taps, dw, db);
}

}  // namespace sg::cuda
