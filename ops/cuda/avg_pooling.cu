// Mean pooling kernels (see avg_pooling.hpp). One thread per element of the
// result, grid-stride, as the max-pool kernels; the backward GATHERS the
// windows covering an input element (no atomics, no zero-fill pass) in the
// CPU reference's (oy, ox) order. The plane mean is one warp per plane,
// lanes striding over it and a butterfly sum at the end.
#include <algorithm>

#include "ops/cuda/avg_pooling.hpp"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/launch_config.cuh"
#include "ops/cuda/pool_sizes.cuh"
#include "ops/cuda/pool_window.cuh"
#include "ops/cuda/warp_reduce.cuh"

namespace sg::cuda {
namespace {

template <typename T, typename I>
__global__ void avg_pool2d_forward_kernel(const T* x, PoolSizes<I> g, T* y) {
  const I stride = I(gridDim.x) * I(blockDim.x);
  const float area = float(g.kernel * g.kernel);
  for (I o = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); o < g.planes * g.oh * g.ow; o += stride) {
    const I plane = o / (g.oh * g.ow), oy = (o / g.ow) % g.oh, ox = o % g.ow;
    const T* window = x + (plane * g.h + oy * g.stride) * g.w + ox * g.stride;
    float acc = 0.f;
    for (I i = 0; i < g.kernel; ++i)
      for (I j = 0; j < g.kernel; ++j) acc += to_float(window[i * g.w + j]);
    y[o] = from_float<T>(acc / area);
  }
}

template <typename T, typename I>
__global__ void avg_pool2d_backward_kernel(const T* dy, PoolSizes<I> g, T* dx) {
  const I stride = I(gridDim.x) * I(blockDim.x);
  const float area = float(g.kernel * g.kernel);
  for (I e = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); e < g.planes * g.h * g.w; e += stride) {
    const I plane = e / (g.h * g.w), y = (e / g.w) % g.h, x = e % g.w;
    const WindowRange<I> rows = windows_containing(y, g.kernel, g.stride, g.oh);
    const WindowRange<I> cols = windows_containing(x, g.kernel, g.stride, g.ow);
    const T* grads = dy + plane * g.oh * g.ow;
    float acc = 0.f;
    for (I oy = rows.lo; oy <= rows.hi; ++oy)
      for (I ox = cols.lo; ox <= cols.hi; ++ox) acc += to_float(grads[oy * g.ow + ox]) / area;
    dx[e] = from_float<T>(acc);
  }
}

// Channels-last [n, h, w, c]: a thread's element is channel ch of one output
// (forward) or input (backward) pixel, so a warp's loads are consecutive
// channels; sums in the same order as the NCHW kernels (and the reference).
template <typename T, typename I>
__global__ void avg_pool2d_nhwc_forward_kernel(const T* x, ChannelsLastPool g, T* y) {
  const I stride = I(gridDim.x) * I(blockDim.x), oh = I(g.oh()), ow = I(g.ow()), c = I(g.c), w = I(g.w);
  const I k = I(g.kernel), s = I(g.stride);
  const float area = float(k * k);
  for (I o = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); o < I(g.n) * oh * ow * c; o += stride) {
    const I ch = o % c, ox = (o / c) % ow, oy = (o / (c * ow)) % oh, n = o / (c * ow * oh);
    const T* window = x + ((n * I(g.h) + oy * s) * w + ox * s) * c + ch;
    float acc = 0.f;
    for (I i = 0; i < k; ++i)
      for (I j = 0; j < k; ++j) acc += to_float(window[(i * w + j) * c]);
    y[o] = from_float<T>(acc / area);
  }
}

template <typename T, typename I>
__global__ void avg_pool2d_nhwc_backward_kernel(const T* dy, ChannelsLastPool g, T* dx) {
  const I stride = I(gridDim.x) * I(blockDim.x), oh = I(g.oh()), ow = I(g.ow()), c = I(g.c), h = I(g.h), w = I(g.w);
  const float area = float(g.kernel * g.kernel);
  for (I e = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); e < I(g.n) * h * w * c; e += stride) {
    const I ch = e % c, x = (e / c) % w, y = (e / (c * w)) % h, n = e / (c * w * h);
    const WindowRange<I> rows = windows_containing(y, I(g.kernel), I(g.stride), oh);
    const WindowRange<I> cols = windows_containing(x, I(g.kernel), I(g.stride), ow);
    const T* grads = dy + n * oh * ow * c + ch;
    float acc = 0.f;
    for (I oy = rows.lo; oy <= rows.hi; ++oy)
      for (I ox = cols.lo; ox <= cols.hi; ++ox) acc += to_float(grads[(oy * ow + ox) * c]) / area;
    dx[e] = from_float<T>(acc);
  }
}

template <typename T>
__global__ void global_avg_pool2d_forward_kernel(const T* x, std::int64_t planes, std::int64_t plane, T* y) {
  const std::int64_t warps = std::int64_t(gridDim.x) * (blockDim.x / 32);
  const int lane = int(threadIdx.x % 32);
  for (std::int64_t p = std::int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; p < planes; p += warps) {
    const T* values = x + p * plane;
    float acc = 0.f;
    for (std::int64_t k = lane; k < plane; k += 32) acc += to_float(values[k]);
    acc = warp_sum(acc);
    if (lane == 0) y[p] = from_float<T>(acc / float(plane));
  }
}

template <typename T, typename I>
__global__ void global_avg_pool2d_backward_kernel(const T* dy, I planes, I plane, T* dx) {
  const I stride = I(gridDim.x) * I(blockDim.x);
  for (I e = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); e < planes * plane; e += stride)
    dx[e] = from_float<T>(to_float(dy[e / plane]) / float(plane));
}

}  // namespace

template <typename T>
void launch_avg_pool2d_forward(const T* x, const PoolGeometry& g, T* y, cudaStream_t stream) {
  const std::int64_t work = g.planes * g.oh() * g.ow();
  if (fits_int32(g.planes * g.h * g.w))
    avg_pool2d_forward_kernel<<<blocks_for(work), kThreads, 0, stream>>>(x, PoolSizes<std::int32_t>(g), y);
  else
    avg_pool2d_forward_kernel<<<blocks_for(work), kThreads, 0, stream>>>(x, PoolSizes<std::int64_t>(g), y);
  SG_LAUNCH_CHECK("avg_pool2d_forward_kernel");
}

template <typename T>
void launch_avg_pool2d_backward(const T* dy, const PoolGeometry& g, T* dx, cudaStream_t stream) {
  const std::int64_t work = g.planes * g.h * g.w;
  if (fits_int32(work))
    avg_pool2d_backward_kernel<<<blocks_for(work), kThreads, 0, stream>>>(dy, PoolSizes<std::int32_t>(g), dx);
  else
    avg_pool2d_backward_kernel<<<blocks_for(work), kThreads, 0, stream>>>(dy, PoolSizes<std::int64_t>(g), dx);
  SG_LAUNCH_CHECK("avg_pool2d_backward_kernel");
}

template <typename T>
void launch_avg_pool2d_nhwc_forward(const T* x, const ChannelsLastPool& g, T* y, cudaStream_t stream) {
  const std::int64_t work = g.n * g.oh() * g.ow() * g.c;
  if (fits_int32(g.n * g.h * g.w * g.c))
    avg_pool2d_nhwc_forward_kernel<T, std::int32_t><<<blocks_for(work), kThreads, 0, stream>>>(x, g, y);
  else
    avg_pool2d_nhwc_forward_kernel<T, std::int64_t><<<blocks_for(work), kThreads, 0, stream>>>(x, g, y);
  SG_LAUNCH_CHECK("avg_pool2d_nhwc_forward_kernel");
}

template <typename T>
void launch_avg_pool2d_nhwc_backward(const T* dy, const ChannelsLastPool& g, T* dx, cudaStream_t stream) {
  const std::int64_t work = g.n * g.h * g.w * g.c;
  if (fits_int32(work))
    avg_pool2d_nhwc_backward_kernel<T, std::int32_t><<<blocks_for(work), kThreads, 0, stream>>>(dy, g, dx);
  else
    avg_pool2d_nhwc_backward_kernel<T, std::int64_t><<<blocks_for(work), kThreads, 0, stream>>>(dy, g, dx);
  SG_LAUNCH_CHECK("avg_pool2d_nhwc_backward_kernel");
}

template <typename T>
void launch_global_avg_pool2d_forward(const T* x, std::int64_t planes, std::int64_t plane, T* y,
                                      cudaStream_t stream) {
  constexpr int warps_per_block = kThreads / 32;
  global_avg_pool2d_forward_kernel<<<blocks_for(planes, warps_per_block), kThreads, 0, stream>>>(x, planes, plane,
                                                                                                   y);
  SG_LAUNCH_CHECK("global_avg_pool2d_forward_kernel");
}

template <typename T>
void launch_global_avg_pool2d_backward(const T* dy, std::int64_t planes, std::int64_t plane, T* dx,
                                       cudaStream_t stream) {
  const std::int64_t work = planes * plane;
  if (fits_int32(work))
    global_avg_pool2d_backward_kernel<<<blocks_for(work), kThreads, 0, stream>>>(
        dy, std::int32_t(planes), std::int32_t(plane), dx);
  else
    global_avg_pool2d_backward_kernel<<<blocks_for(work), kThreads, 0, stream>>>(dy, planes, plane, dx);
  SG_LAUNCH_CHECK("global_avg_pool2d_backward_kernel");
}

#define SG_INSTANTIATE_MEAN_POOLING(T)                                                                             \
  template void launch_avg_pool2d_forward<T>(const T*, const PoolGeometry&, T*, cudaStream_t);                     \
  template void launch_avg_pool2d_backward<T>(const T*, const PoolGeometry&, T*, cudaStream_t);                    \
  template void launch_avg_pool2d_nhwc_forward<T>(const T*, const ChannelsLastPool&, T*, cudaStream_t);            \
  template void launch_avg_pool2d_nhwc_backward<T>(const T*, const ChannelsLastPool&, T*, cudaStream_t);           \
  template void launch_global_avg_pool2d_forward<T>(const T*, std::int64_t, std::int64_t, T*, cudaStream_t);       \
  template void launch_global_avg_pool2d_backward<T>(const T*, std::int64_t, std::int64_t, T*, cudaStream_t);
SG_INSTANTIATE_MEAN_POOLING(float)
SG_INSTANTIATE_MEAN_POOLING(__half)
SG_INSTANTIATE_MEAN_POOLING(__nv_bfloat16)
#undef SG_INSTANTIATE_MEAN_POOLING

}  // namespace sg::cuda
