// Max pooling and its fused neighbours (see pooling.hpp). One thread per
// element of the result (pooled elements forward, input elements backward),
// grid-stride. The backward GATHERS: each input element visits the few
// windows that contain it and adds the gradients of those whose argmax it
// is, in (oy, ox) order: no atomics, no zero-fill pass, and with overlapping
// windows the same f32 sum in the same order as the CPU reference.
#include <algorithm>

#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/launch_config.cuh"
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

// ref::max_pool2d_argmax: the first maximum in row-major window order wins a
// tie, and a NaN wins over numbers (the first NaN of several).
__device__ __forceinline__ bool replaces(float candidate, float best) {
  return candidate > best || (isnan(candidate) && !isnan(best));
}

template <typename T>
__global__ void max_pool2d_forward_kernel(const T* x, const std::int32_t* step_counter, PoolGeometry g,
                                          PlaneDropout dropout, T* dropped, T* pooled, T* activated) {
  const std::int32_t step = dropout.active ? *step_counter : 0;
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  const std::int64_t first = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x;
  const std::int64_t plane_size = g.h * g.w;
  // dropout2d's output, when read after the launch (the pooling's backward
  // takes its argmax from it): every element, windows or not.
  if (dropped)
    for (std::int64_t i = first; i < g.planes * plane_size; i += stride) {
      const float f = plane_factor(dropout, step, i / plane_size);
      dropped[i] = from_float<T>(dropped_value(x[i], f, true));
    }
  const std::int64_t oh = g.oh(), ow = g.ow();
  for (std::int64_t o = first; o < g.planes * oh * ow; o += stride) {
    const std::int64_t plane = o / (oh * ow), oy = (o / ow) % oh, ox = o % ow;
    const float f = plane_factor(dropout, step, plane);
    const T* window = x + plane * plane_size + oy * g.stride * g.w + ox * g.stride;
    float best = dropped_value(window[0], f, dropout.active);
    for (std::int64_t i = 0; i < g.kernel; ++i)
      for (std::int64_t j = 0; j < g.kernel; ++j) {
        const float v = dropped_value(window[i * g.w + j], f, dropout.active);
        if (replaces(v, best)) best = v;
      }
    // best is one of the window's stored values: converting back is exact.
    if (pooled) pooled[o] = from_float<T>(best);
    if (activated) activated[o] = from_float<T>(best > 0.f ? best : 0.f);  // ref::relu (NaN -> 0)
  }
}

// The index in its plane of window (oy, ox)'s first maximum of x.
template <typename T>
__device__ __forceinline__ std::int64_t window_argmax(const T* plane, const PoolGeometry& g, std::int64_t oy,
                                                      std::int64_t ox) {
  std::int64_t best = oy * g.stride * g.w + ox * g.stride;
  float best_v = to_float(plane[best]);
  for (std::int64_t i = 0; i < g.kernel; ++i)
    for (std::int64_t j = 0; j < g.kernel; ++j) {
      const std::int64_t at = (oy * g.stride + i) * g.w + ox * g.stride + j;
      const float v = to_float(plane[at]);
      if (replaces(v, best_v)) {
        best = at;
        best_v = v;
      }
    }
  return best;
}

// relu_backward (ref::relu_backward): the gradient where the relu's output
// is positive, else 0; no relu (null output): the gradient itself.
template <typename T>
__device__ __forceinline__ float through_relu(float grad, const T* relu_out, std::int64_t at) {
  return relu_out && !(to_float(relu_out[at]) > 0.f) ? 0.f : grad;
}

template <typename T>
__global__ void max_pool2d_backward_kernel(PoolBackwardTensors<T> t, const std::int32_t* step_counter, PoolGeometry g,
                                           PlaneDropout dropout) {
  const std::int32_t step = dropout.active ? *step_counter : 0;
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  const std::int64_t first = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x;
  const std::int64_t oh = g.oh(), ow = g.ow(), plane_size = g.h * g.w;
  if (t.relu_before_grad)  // the first relu_backward's output, when read after the launch
    for (std::int64_t o = first; o < g.planes * oh * ow; o += stride)
      t.relu_before_grad[o] = from_float<T>(through_relu(to_float(t.dy[o]), t.relu_before, o));
  for (std::int64_t i = first; i < g.planes * plane_size; i += stride) {
    const std::int64_t plane = i / plane_size, y = (i / g.w) % g.h, xx = i % g.w;
    const std::int64_t at = y * g.w + xx;
    const T* xp = t.x + plane * plane_size;
    // Windows (oy, ox) containing (y, xx): oy*s <= y < oy*s + k, within [0, oh).
    const std::int64_t oy_lo = y >= g.kernel ? (y - g.kernel) / g.stride + 1 : 0;
    const std::int64_t ox_lo = xx >= g.kernel ? (xx - g.kernel) / g.stride + 1 : 0;
    const std::int64_t oy_hi = y / g.stride < oh ? y / g.stride : oh - 1;
    const std::int64_t ox_hi = xx / g.stride < ow ? xx / g.stride : ow - 1;
    float acc = 0.f;
    for (std::int64_t oy = oy_lo; oy <= oy_hi; ++oy)
      for (std::int64_t ox = ox_lo; ox <= ox_hi; ++ox)
        if (window_argmax(xp, g, oy, ox) == at) {
          const std::int64_t o = (plane * oh + oy) * ow + ox;
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

}  // namespace

template <typename T>
void launch_max_pool2d_forward(const T* x, const std::int32_t* step, const PoolGeometry& g, const PlaneDropout& dropout,
                               T* dropped, T* pooled, T* activated, cudaStream_t stream) {
  const std::int64_t work = std::max(dropped ? g.planes * g.h * g.w : 0, g.planes * g.oh() * g.ow());
  max_pool2d_forward_kernel<<<blocks_for(work), kThreads, 0, stream>>>(x, step, g, dropout, dropped, pooled, activated);
  SG_LAUNCH_CHECK("max_pool2d_forward_kernel");
}

template <typename T>
void launch_max_pool2d_backward(const PoolBackwardTensors<T>& t, const std::int32_t* step, const PoolGeometry& g,
                                const PlaneDropout& dropout, cudaStream_t stream) {
  if (!dropout.active && t.dx != t.pool_grad && t.dx != t.relu_after_grad)
    throw CudaError("max_pool2d_backward: without dropout the result is the pooling's or the relu's gradient");
  max_pool2d_backward_kernel<<<blocks_for(g.planes * g.h * g.w), kThreads, 0, stream>>>(t, step, g, dropout);
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
