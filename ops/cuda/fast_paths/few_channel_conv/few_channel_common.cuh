#pragma once
// What the few-channel forward and weight-gradient kernels share
// (few_channel_conv.hpp): the band geometry, the staging of a band's
// zero-padded input, where each tap reads it, and mma operand packing.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "ops/cuda/conv_direct_common.cuh"
#include "ops/cuda/mma_fragments.cuh"
#include "ops/cuda/scaled_pixel.cuh"
#include "ops/cuda/fast_paths/few_channel_conv/few_channel_conv.hpp"

namespace sg::cuda::few_channel {

inline constexpr int kGroup = 8;            // output channels come in mma tiles of 8
inline constexpr int kBlockThreads = 256;   // per block
inline constexpr int kMaxKernel = 7;        // filters up to 7x7 (an RGB stem's)
inline constexpr int kMaxShared = 100 * 1024;
inline constexpr int kMaxOutputs = 128;     // output channels: the forward's accumulators a thread holds

// One band: output rows [first_row, first_row + rows) of image n read input
// rows from first_row * stride - padding, in_rows of them; the staged input
// is s[c][in_rows][pitch], column q holding input column q - padding.
struct Dims {
  int n, h, w, c, o, kh, kw, stride, padding, oh, ow;
  int band_rows, in_rows, cols, pitch;
};

// An odd pitch: a warp's reads of several staged rows at one column fall in
// distinct banks.
inline int odd_pitch(int cols) { return cols % 2 == 0 ? cols + 1 : cols; }

inline Dims dims_for(const FewChannelConvShape& s, int band_rows, int cols) {
  const int st = int(s.stride);
  return {int(s.n), int(s.h),       int(s.w),        int(s.c),  int(s.o), int(s.kh), int(s.kw), st,
          int(s.padding), int(s.oh()), int(s.ow()), band_rows, (band_rows - 1) * st + int(s.kh), cols,
          odd_pitch(cols)};
}

// The staged input band's elements (T).
__host__ __device__ inline int staged_input_elements(const Dims& d) { return d.c * d.in_rows * d.pitch; }

// f(r, q) for every r < rows and q < cols, the cells dealt to the block's
// threads in row-major order, with no division past the first (staging
// by a generic per-element index, two divisions a cell, had cost more
// instructions than the convolution itself).
template <typename F>
__device__ __forceinline__ void for_each_cell(int rows, int cols, F f) {
  const int step_rows = int(blockDim.x) / cols, step_cols = int(blockDim.x) - step_rows * cols;
  int r = int(threadIdx.x) / cols, q = int(threadIdx.x) - r * cols;
#pragma unroll 4
  for (; r < rows;) {
    f(r, q);
    r += step_rows;
    q += step_cols;
    if (q >= cols) {
      q -= cols;
      ++r;
    }
  }
}

// Stages input rows [first_in_row, first_in_row + in_rows) of image x
// [h, w, c] into s[c][in_rows][pitch] (T), zero outside the image and in the
// pitch's spare columns; a warp's loads run along a row.
template <typename T>
__device__ __forceinline__ void stage_input_band(const T* x, const Dims& d, int first_in_row, T* s) {
  for_each_cell(d.in_rows, d.pitch, [=](int r, int q) {
    const int iy = first_in_row + r, ix = q - d.padding;
    const bool inside = iy >= 0 && iy < d.h && ix >= 0 && ix < d.w;
    for (int ch = 0; ch < d.c; ++ch)
      s[(ch * d.in_rows + r) * d.pitch + q] = inside ? x[(iy * d.w + ix) * d.c + ch] : from_float<T>(0.f);
  });
}

// The same from the dataset's u8 image [h, w, c] (FewChannelFetch: scaled as
// the batch fetch scales, through scaled_pixel.cuh, so the bits are its own).
template <typename T>
__device__ __forceinline__ void stage_fetched_band(const std::uint8_t* image, float scale, float shift, const Dims& d,
                                                   int first_in_row, T* s) {
  for_each_cell(d.in_rows, d.pitch, [=](int r, int q) {
    const int iy = first_in_row + r, ix = q - d.padding;
    const bool inside = iy >= 0 && iy < d.h && ix >= 0 && ix < d.w;
    for (int ch = 0; ch < d.c; ++ch)
      s[(ch * d.in_rows + r) * d.pitch + q] =
          inside ? scaled_pixel<T>(image[(iy * d.w + ix) * d.c + ch], scale, shift) : from_float<T>(0.f);
  });
}

// Where tap k of a filter [c][kh][kw] reads the staged input, from the
// element of its output pixel's first tap; taps past the filter (the
// padding of K to the mma's 16 or 8) read that first element: a finite
// value the zero weights or the discarded outputs cancel.
__device__ __forceinline__ int tap_offset(const Dims& d, int k) {
  const int taps = d.kh * d.kw;
  if (k >= d.c * taps) return 0;
  const int ch = k / taps, t = k - ch * taps, i = t / d.kw, j = t - i * d.kw;
  return (ch * d.in_rows + i) * d.pitch + j;
}

// Two T from shared memory as one mma register (low half first).
template <typename T>
__device__ __forceinline__ std::uint32_t pack_pair(T lo, T hi) {
  std::uint16_t l, h;
  static_assert(sizeof(T) == 2);
  memcpy(&l, &lo, 2);
  memcpy(&h, &hi, 2);
  return std::uint32_t(l) | (std::uint32_t(h) << 16);
}

}  // namespace sg::cuda::few_channel
