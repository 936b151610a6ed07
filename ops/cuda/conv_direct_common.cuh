#pragma once
// What the direct convolution kernels share (conv_direct.cu: forward and
// backward data; conv_direct_wgrad.cu: the weight gradient): the staged
// window's dims, shared-memory staging with loads in flight, vector reads of
// a channel group, and the planners' small helpers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "ops/cuda/conv_window.cuh"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/launch_config.cuh"

namespace sg::cuda::conv_direct {

inline constexpr int kDirectThreads = 512;
inline constexpr int kDirectMaxShared = 100 * 1024;  // two blocks per multiprocessor still fit

// One image's input planes [ci, ih, iw] -> output planes [co, oh, ow]. The
// staged window is ph x pw per input channel: the zero-padded rows and
// columns the outputs read (window (py, px) is input (py - pad_h, px - pad_w)).
struct DirectDims {
  int n, ci, ih, iw, co, kh, kw, stride, pad_h, pad_w, oh, ow, ph, pw;
};

// G consecutive f32 from shared memory (16- or 8-byte aligned: offsets are multiples of G).
template <int G>
__device__ __forceinline__ void load_group(const float* p, float (&v)[G]) {
  if constexpr (G % 4 == 0) {
#pragma unroll
    for (int g = 0; g < G; g += 4) {
      const float4 q = *reinterpret_cast<const float4*>(p + g);
      v[g] = q.x;
      v[g + 1] = q.y;
      v[g + 2] = q.z;
      v[g + 3] = q.w;
    }
  } else {
#pragma unroll
    for (int g = 0; g < G; g += 2) {
      const float2 q = *reinterpret_cast<const float2*>(p + g);
      v[g] = q.x;
      v[g + 1] = q.y;
    }
  }
}

// store(e, value(e)) for e < total, by the whole block, 8 global loads in
// flight per thread before the stores (few threads per block: one load at a
// time would leave the block waiting out each load's latency in turn).
template <typename Value, typename Store>
__device__ __forceinline__ void stage(int total, Value value, Store store) {
  constexpr int kInFlight = 8;
  for (int base = threadIdx.x; base < total; base += kInFlight * blockDim.x) {
    float v[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int e = base + u * blockDim.x;
      v[u] = e < total ? value(e) : 0.f;
    }
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int e = base + u * blockDim.x;
      if (e < total) store(e, v[u]);
    }
  }
}

// Stages `channels` planes [ih, iw] from `planes` into the zero-padded
// window s[channels][ph][pw] (consecutive threads read along a row).
template <typename T>
__device__ void stage_window(const T* planes, int channels, int ih, int iw, int pad_h, int pad_w, int ph, int pw,
                             float* s) {
  const int window = ph * pw;
  stage(
      channels * window,
      [=](int e) {
        const int c = e / window, r = e - c * window, py = r / pw, px = r - py * pw;
        const int iy = py - pad_h, ix = px - pad_w;
        return iy >= 0 && iy < ih && ix >= 0 && ix < iw ? to_float(planes[(c * ih + iy) * iw + ix]) : 0.f;
      },
      [=](int e, float v) { s[e] = v; });
}

inline bool fits_int(std::int64_t v) { return v < (std::int64_t(1) << 31); }

inline int round_warp(std::int64_t v) { return static_cast<int>((v + 31) / 32 * 32); }

// Channels per thread: the widest of 8, 4, 2 that pads `channels` by at
// most a quarter and still gives `units` x groups >= `wanted` (threads).
inline int pick_group(std::int64_t channels, std::int64_t units, std::int64_t wanted) {
  for (const int g : {8, 4, 2}) {
    const std::int64_t groups = (channels + g - 1) / g;
    if ((groups * g - channels) * 4 <= channels && units * groups >= wanted) return g;
  }
  return 2;
}

// Lets `kernel` take more than 48 KiB of dynamic shared memory when it asks.
template <typename Kernel>
void allow_shared(Kernel kernel, int bytes) {
  if (bytes > 48 * 1024)
    SG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

}  // namespace sg::cuda::conv_direct
