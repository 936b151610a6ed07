#pragma once
// The second pass of a weight gradient computed as ordered per-block f32
// partials (the direct convolution's, conv_direct_wgrad.cu, and the
// few-channel convolution's, fast_paths/few_channel_conv): each element is
// the sum of its partials in a fixed order, so every run gives the same bits.
#include "ops/cuda/launch_config.cuh"

namespace sg::cuda {

// Element e = o * outs + k of the partials [parts][elements] is dw[o][k]
// (k < taps) or db[o] (k == taps, with the bias): the sum of its `parts`
// partials, one warp per element, lane l adding parts l, l + 32, ... in
// order, then a fixed shuffle tree. db is rounded to T, then widened when B
// is float (the graph's T sum and its cast).
template <typename T, typename B>
__global__ void wgrad_partials_finish(const float* partials, int parts, int elements, int outs, int taps, T* dw,
                                      B* db) {
  const int lane = threadIdx.x % 32;
  for (int e = (blockIdx.x * blockDim.x + threadIdx.x) / 32; e < elements; e += gridDim.x * blockDim.x / 32) {
    float v = 0.f;
#pragma unroll 4
    for (int q = lane; q < parts; q += 32) v += partials[q * elements + e];
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (lane != 0) continue;
    const int o = e / outs, k = e - o * outs;
    if (k < taps) dw[o * taps + k] = from_float<T>(v);
    else db[o] = from_float<B>(to_float(from_float<T>(v)));
  }
}

}  // namespace sg::cuda
