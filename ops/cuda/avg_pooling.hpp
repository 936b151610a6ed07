#pragma once
// Mean pooling on the GPU (issue 37), the CPU reference's contract
// (ops/cpu/avg_pool_reference.hpp): avg_pool2d over square windows with no
// padding, its backward, and the mean of whole planes (global_avg_pool2d)
// with its backward. f32 accumulation, results rounded to T once.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "ops/cuda/channels_last.hpp"
#include "ops/cuda/pooling.hpp"

namespace sg::cuda {

// x [planes, h, w] -> y [planes, oh, ow]: window sums in row-major order / kernel^2.
template <typename T>
void launch_avg_pool2d_forward(const T* x, const PoolGeometry& g, T* y, cudaStream_t stream);

// dy [planes, oh, ow] -> dx [planes, h, w]: each element gathers dy / kernel^2
// of the windows covering it in (oy, ox) order (0 where none does).
template <typename T>
void launch_avg_pool2d_backward(const T* dy, const PoolGeometry& g, T* dx, cudaStream_t stream);

// The same two over channels-last values: x [n, h, w, c] -> y [n, oh, ow, c]
// and back (ChannelsLastPool's pooled_channels_first is not read).
template <typename T>
void launch_avg_pool2d_nhwc_forward(const T* x, const ChannelsLastPool& g, T* y, cudaStream_t stream);
template <typename T>
void launch_avg_pool2d_nhwc_backward(const T* dy, const ChannelsLastPool& g, T* dx, cudaStream_t stream);

// x [planes, plane] -> y [planes]: each plane's mean (one warp per plane).
template <typename T>
void launch_global_avg_pool2d_forward(const T* x, std::int64_t planes, std::int64_t plane, T* y,
                                      cudaStream_t stream);

// dy [planes] -> dx [planes, plane]: dy / plane in every element of its plane.
template <typename T>
void launch_global_avg_pool2d_backward(const T* dy, std::int64_t planes, std::int64_t plane, T* dx,
                                       cudaStream_t stream);

}  // namespace sg::cuda
