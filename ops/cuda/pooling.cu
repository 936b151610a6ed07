// Max pooling and its fused neighbours (see pooling.hpp). One thread per
// element of the result (pooled elements forward, input elements backward),
// grid-stride. The backward GATHERS: each input element visits the few
// windows that contain it and adds the gradients of those whose argmax it
// is, in (oy, ox) order: no atomics, no zero-fill pass, and with overlapping
// windows the same f32 sum in the same order as the CPU reference. Windows
// that tile the plane (2x2 at stride 2 on an even plane) take one thread per
// window instead, with the same results.
#include <algorithm>

#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/launch_config.cuh"
#include "ops/cuda/pool_sizes.cuh"
#include "ops/cuda/pool_window.cuh"
#include "ops/cuda/pooling.hpp"
#include "ops/philox.hpp"

namespace sg::cuda {
namespace {

// Plane p's dropout2d factor: 1 without dropout, else scale or 0.
__device__ __forceinline__ float plane_factor(const PlaneDropout& d, std::int32_t step, std::int64_t plane) {
  if (!d.active) return 1.f;
  return philox::dropout_keep(d.params.seed, d.params.stream, step, plane, d.params.threshold) ? d.params.scale : 0.f;
}

// dropout2d of one element as the graph stores it: x * factor rounded to T
// (a dropped plane is exactly 0, whatever x holds).
template <typename T>
__device__ __forceinline__ float dropped_value(T x, float factor, bool active) {
  if (!active) return to_float(x);
  return factor == 0.f ? 0.f : to_float(from_float<T>(to_float(x) * factor));
}

template <typename T, typename I>
__global__ void max_pool2d_forward_kernel(const T* x, const std::int32_t* step_counter, PoolSizes<I> g,
                                          PlaneDropout dropout, T* dropped, T* pooled, T* activated) {
  const std::int32_t step = dropout.active ? *step_counter : 0;
  const I stride = I(gridDim.x) * I(blockDim.x);
  const I first = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x);
  const I plane_size = g.h * g.w;
  // dropout2d's output, when read after the launch (the pooling's backward
  // takes its argmax from it): every element, windows or not.
  if (dropped)
    for (I i = first; i < g.planes * plane_size; i += stride) {
      const float f = plane_factor(dropout, step, i / plane_size);
      dropped[i] = from_float<T>(dropped_value(x[i], f, true));
    }
  for (I o = first; o < g.planes * g.oh * g.ow; o += stride) {
    const I plane = o / (g.oh * g.ow), oy = (o / g.ow) % g.oh, ox = o % g.ow;
    const float f = plane_factor(dropout, step, plane);
    const T* xp = x + plane * plane_size;
    const float best =
        window_max([&](I at) { return dropped_value(xp[at], f, dropout.active); }, g.w, g.kernel, g.stride, oy, ox)
            .value;
    // best is one of the window's stored values: converting back is exact.
    if (pooled) pooled[o] = from_float<T>(best);
    if (activated) activated[o] = from_float<T>(best > 0.f ? best : 0.f);  // ref::relu (NaN -> 0)
  }
}

// The index in its plane of window (oy, ox)'s first maximum of x (pool_window.cuh).
template <typename T, typename I>
__device__ __forceinline__ I window_argmax(const T* plane, const PoolSizes<I>& g, I oy, I ox) {
  return window_max([&](I at) { return to_float(plane[at]); }, g.w, g.kernel, g.stride, oy, ox).at;
}

// relu_backward (ref::relu_backward): the gradient where the relu's output
// is positive, else 0; no relu (null output): the gradient itself.
template <typename T, typename I>
__device__ __forceinline__ float through_relu(float grad, const T* relu_out, I at) {
  return relu_out && !(to_float(relu_out[at]) > 0.f) ? 0.f : grad;
}

template <typename T, typename I>
__global__ void max_pool2d_backward_kernel(PoolBackwardTensors<T> t, const std::int32_t* step_counter, PoolSizes<I> g,
                                           PlaneDropout dropout) {
  const std::int32_t step = dropout.active ? *step_counter : 0;
  const I stride = I(gridDim.x) * I(blockDim.x);
  const I first = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x);
  const I oh = g.oh, ow = g.ow, plane_size = g.h * g.w;
  if (t.relu_before_grad)  // the first relu_backward's output, when read after the launch
    for (I o = first; o < g.planes * oh * ow; o += stride)
      t.relu_before_grad[o] = from_float<T>(through_relu(to_float(t.dy[o]), t.relu_before, o));
  for (I i = first; i < g.planes * plane_size; i += stride) {
    const I plane = i / plane_size, at = i - plane * plane_size, y = at / g.w, xx = at - y * g.w;
    const T* xp = t.x + plane * plane_size;
    // The windows (oy, ox) containing (y, xx).
    const WindowRange<I> rows = windows_containing(y, g.kernel, g.stride, oh);
    const WindowRange<I> cols = windows_containing(xx, g.kernel, g.stride, ow);
    float acc = 0.f;
    for (I oy = rows.lo; oy <= rows.hi; ++oy)
      for (I ox = cols.lo; ox <= cols.hi; ++ox)
        if (window_argmax(xp, g, oy, ox) == at) {
          const I o = (plane * oh + oy) * ow + ox;
          acc += through_relu(to_float(t.dy[o]), t.relu_before, o);
        }
    // Each step of the chain rounded to T, as the graph stores it.
    const T pooled = from_float<T>(acc);
    if (t.pool_grad) t.pool_grad[i] = pooled;
    const T relu_after = from_float<T>(through_relu(to_float(pooled), t.relu_after, i));
    if (t.relu_after_grad) t.relu_after_grad[i] = relu_after;
    if (dropout.active) t.dx[i] = from_float<T>(dropped_value(relu_after, plane_factor(dropout, step, plane), true));
  }
}

// Windows that tile the plane (kernel == stride, no rows or columns left
// over): each input element lies in exactly one window, so one thread per
// WINDOW finds its argmax once and writes its k x k elements: the gather's
// results (0 + the one gradient, 0 elsewhere) with a quarter of its index
// arithmetic for 2x2 windows and the argmax once instead of k x k times.
template <typename T, typename I>
__global__ void max_pool2d_backward_tiled_kernel(PoolBackwardTensors<T> t, const std::int32_t* step_counter,
                                                 PoolSizes<I> g, PlaneDropout dropout) {
  const std::int32_t step = dropout.active ? *step_counter : 0;
  const I stride = I(gridDim.x) * I(blockDim.x);
  const I windows = g.oh * g.ow, plane_size = g.h * g.w;
  for (I o = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); o < g.planes * windows; o += stride) {
    const I plane = o / windows, r = o - plane * windows, oy = r / g.ow, ox = r - oy * g.ow;
    const float grad = through_relu(to_float(t.dy[o]), t.relu_before, o);
    if (t.relu_before_grad) t.relu_before_grad[o] = from_float<T>(grad);
    const I argmax = window_argmax(t.x + plane * plane_size, g, oy, ox);
    const float factor = plane_factor(dropout, step, plane);
    const I corner = oy * g.stride * g.w + ox * g.stride;
    for (I i = 0; i < g.kernel; ++i)
      for (I j = 0; j < g.kernel; ++j) {
        const I at = corner + i * g.w + j, k = plane * plane_size + at;
        const T pooled = from_float<T>(at == argmax ? 0.f + grad : 0.f);  // the gather's f32 sum: 0 + its one term
        if (t.pool_grad) t.pool_grad[k] = pooled;
        const T relu_after = from_float<T>(through_relu(to_float(pooled), t.relu_after, k));
        if (t.relu_after_grad) t.relu_after_grad[k] = relu_after;
        if (dropout.active) t.dx[k] = from_float<T>(dropped_value(relu_after, factor, true));
      }
  }
}

}  // namespace

template <typename T>
void launch_max_pool2d_forward(const T* x, const std::int32_t* step, const PoolGeometry& g, const PlaneDropout& dropout,
                               T* dropped, T* pooled, T* activated, cudaStream_t stream) {
  const std::int64_t work = std::max(dropped ? g.planes * g.h * g.w : 0, g.planes * g.oh() * g.ow());
  if (fits_int32(g))
    max_pool2d_forward_kernel<<<blocks_for(work), kThreads, 0, stream>>>(x, step, PoolSizes<std::int32_t>(g), dropout,
                                                                          dropped, pooled, activated);
  else
    max_pool2d_forward_kernel<<<blocks_for(work), kThreads, 0, stream>>>(x, step, PoolSizes<std::int64_t>(g), dropout,
                                                                          dropped, pooled, activated);
  SG_LAUNCH_CHECK("max_pool2d_forward_kernel");
}

template <typename T>
void launch_max_pool2d_backward(const PoolBackwardTensors<T>& t, const std::int32_t* step, const PoolGeometry& g,
                                const PlaneDropout& dropout, cudaStream_t stream) {
  if (!dropout.active && t.dx != t.pool_grad && t.dx != t.relu_after_grad)
    throw CudaError("max_pool2d_backward: without dropout the result is the pooling's or the relu's gradient");
  const bool tiled = g.kernel == g.stride && g.h == g.oh() * g.kernel && g.w == g.ow() * g.kernel;
  const unsigned blocks = blocks_for(tiled ? g.planes * g.oh() * g.ow() : g.planes * g.h * g.w);
  const auto run = [&](auto sizes) {
    if (tiled)
      max_pool2d_backward_tiled_kernel<<<blocks, kThreads, 0, stream>>>(t, step, sizes, dropout);
    else
      max_pool2d_backward_kernel<<<blocks, kThreads, 0, stream>>>(t, step, sizes, dropout);
  };
  if (fits_int32(g))
    run(PoolSizes<std::int32_t>(g));
  else
    run(PoolSizes<std::int64_t>(g));
  SG_LAUNCH_CHECK("max_pool2d_backward_kernel");
}

#define SG_INSTANTIATE_POOLING(T)                                                                                     \
  template void launch_max_pool2d_forward<T>(const T*, const std::int32_t*, const PoolGeometry&, const PlaneDropout&, \
                                             T*, T*, T*, cudaStream_t);                                               \
  template void launch_max_pool2d_backward<T>(const PoolBackwardTensors<T>&, const std::int32_t*, const PoolGeometry&, \
                                              const PlaneDropout&, cudaStream_t);
SG_INSTANTIATE_POOLING(float)
SG_INSTANTIATE_POOLING(__half)
SG_INSTANTIATE_POOLING(__nv_bfloat16)
#undef SG_INSTANTIATE_POOLING

}  // namespace sg::cuda
