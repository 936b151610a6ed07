// Max pooling and its fused neighbours (see pooling.hpp). One thread per
// element of the result (pooled elements forward, input elements backward),
// grid-stride. The backward GATHERS: each input element visits the few
// windows that contain it and adds the gradients of those whose argmax it
// is, in (oy, ox) order: no atomics, no zero-fill pass, and with overlapping
// windows the same f32 sum in the same order as the CPU reference. Windows
// that tile the plane (kernel == stride, no rows or columns left over) take
// one thread per window instead, with the same results; for 2x2 and 3x3
// windows (the CNNs' pools) one thread per V adjacent windows of a row, its
// k input rows of V*k contiguous elements moved in packs of up to 16 bytes
// (the "packed" kernels, forward and backward).
#include <algorithm>
#include <initializer_list>
#include <type_traits>

#include "ops/cuda/activation.cuh"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/launch_config.cuh"
#include "ops/cuda/packed_access.cuh"
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
// 2x2 and 3x3 windows with 32-bit indices take the packed kernel below;
// this one the other sizes.
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
        const T pooled = from_float<T>(tiled_window_gradient(at == argmax, grad));
        if (t.pool_grad) t.pool_grad[k] = pooled;
        const T relu_after = from_float<T>(through_relu(to_float(pooled), t.relu_after, k));
        if (t.relu_after_grad) t.relu_after_grad[k] = relu_after;
        if (dropout.active) t.dx[k] = from_float<T>(dropped_value(relu_after, factor, true));
      }
  }
}

// The packed kernels: windows that tile the plane, k x k with K = k in {2, 3},
// V (1, 2 or 4, dividing ow) adjacent windows of one output row a thread.
// Thread q takes the windows [q*V, q*V + V) of the flattened output, i.e. the
// output row r = q / (ow / V) (the one division per thread) and the K input
// rows r*K + i, each V*K contiguous elements from column (q mod ow/V) * V*K,
// read and written in packs of B bytes (B == sizeof(T): one element at a
// time; the host picks B so that every row's pack is aligned). The tensors of
// the output's shape move V elements at a time when aligned to it
// (`packed_out`). Every window's maximum comes from window_max over the
// thread's registers, so the tie and NaN rules, and so the bits, are those of
// the generic kernels.

// V elements at p, one access when `packed`, else one by one.
template <int V, typename T>
__device__ __forceinline__ void load_out(const T* p, T (&v)[V], bool packed) {
  if (packed)
    load_packed<V * int(sizeof(T))>(p, v);
  else
    load_packed<int(sizeof(T))>(p, v);
}
template <int V, typename T>
__device__ __forceinline__ void store_out(T* p, const T (&v)[V], bool packed) {
  if (packed)
    store_packed<V * int(sizeof(T))>(p, v);
  else
    store_packed<int(sizeof(T))>(p, v);
}

template <typename T, int K, int V, int B>
__global__ void __launch_bounds__(kThreads)
    max_pool2d_forward_packed_kernel(const T* x, const std::int32_t* step_counter, PoolSizes<std::int32_t> g,
                                     PlaneDropout dropout, T* dropped, T* pooled, T* activated, bool packed_out) {
  constexpr int kRow = V * K;  // a thread's elements of one input row
  const std::int32_t step = dropout.active ? *step_counter : 0;
  const int row_groups = g.ow / V, groups = g.planes * g.oh * row_groups;
  const int stride = int(gridDim.x) * int(blockDim.x);
  for (int q = int(blockIdx.x) * int(blockDim.x) + int(threadIdx.x); q < groups; q += stride) {
    const int r = q / row_groups;  // output row: plane * oh + oy
    const int first = r * K * g.w + (q - r * row_groups) * kRow;
    const float factor = dropout.active ? plane_factor(dropout, step, r / g.oh) : 1.f;
    float v[K * kRow];  // the windows' values (after dropout2d), [row][column]
#pragma unroll
    for (int i = 0; i < K; ++i) {
      T raw[kRow];
      load_packed<B>(x + first + i * g.w, raw);
#pragma unroll
      for (int e = 0; e < kRow; ++e) {
        v[i * kRow + e] = dropped_value(raw[e], factor, dropout.active);
        raw[e] = from_float<T>(v[i * kRow + e]);  // dropout2d's output as stored (exact: a value of T)
      }
      if (dropped) store_packed<B>(dropped + first + i * g.w, raw);
    }
    T best_pooled[V], best_activated[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      // Window j's first maximum: its columns j*K.. of the thread's rows.
      const float best = window_max([&](int at) { return v[at]; }, kRow, K, K, 0, j).value;
      best_pooled[j] = from_float<T>(best);
      best_activated[j] = from_float<T>(best > 0.f ? best : 0.f);  // ref::relu (NaN -> 0)
    }
    if (pooled) store_out(pooled + q * V, best_pooled, packed_out);
    if (activated) store_out(activated + q * V, best_activated, packed_out);
  }
}

// The backward of the same windows: each input element of a window gets
// 0 + the window's gradient at its first maximum, 0 elsewhere (the gather's
// f32 sum), then the chain's relu_backward and dropout2d_backward, each
// rounded to T as the graph stores it. A thread reads all it needs before it
// writes, and only the elements it writes: results written over an input
// (a planned buffer reused in place) stay right.
template <typename T, int K, int V, int B>
__global__ void __launch_bounds__(kThreads)
    max_pool2d_backward_packed_kernel(PoolBackwardTensors<T> t, const std::int32_t* step_counter,
                                      PoolSizes<std::int32_t> g, PlaneDropout dropout, bool packed_out) {
  constexpr int kRow = V * K;
  const std::int32_t step = dropout.active ? *step_counter : 0;
  const int row_groups = g.ow / V, groups = g.planes * g.oh * row_groups;
  const int stride = int(gridDim.x) * int(blockDim.x);
  const bool relu_before = t.relu_before != nullptr, relu_after = t.relu_after != nullptr;
  for (int q = int(blockIdx.x) * int(blockDim.x) + int(threadIdx.x); q < groups; q += stride) {
    const int r = q / row_groups;
    const int first = r * K * g.w + (q - r * row_groups) * kRow;
    T dy[V], gate[V] = {};
    load_out(t.dy + q * V, dy, packed_out);
    if (relu_before) load_out(t.relu_before + q * V, gate, packed_out);
    float grad[V];
    T grad_out[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      grad[j] = relu_backward_if(to_float(dy[j]), relu_before, gate[j]);
      grad_out[j] = from_float<T>(grad[j]);
    }
    float xv[K * kRow];
    T after[K][kRow] = {};  // the relu-after's output, where there is one
#pragma unroll
    for (int i = 0; i < K; ++i) {
      T raw[kRow];
      load_packed<B>(t.x + first + i * g.w, raw);
#pragma unroll
      for (int e = 0; e < kRow; ++e) xv[i * kRow + e] = to_float(raw[e]);
      if (relu_after) load_packed<B>(t.relu_after + first + i * g.w, after[i]);
    }
    int argmax[V];
#pragma unroll
    for (int j = 0; j < V; ++j) argmax[j] = window_max([&](int at) { return xv[at]; }, kRow, K, K, 0, j).at;
    if (t.relu_before_grad) store_out(t.relu_before_grad + q * V, grad_out, packed_out);
    const float factor = dropout.active ? plane_factor(dropout, step, r / g.oh) : 1.f;
#pragma unroll
    for (int i = 0; i < K; ++i) {
      T pooled[kRow], activated[kRow], dx[kRow];
#pragma unroll
      for (int e = 0; e < kRow; ++e) {
        const int j = e / K;  // the element's window (a constant once unrolled)
        pooled[e] = from_float<T>(tiled_window_gradient(i * kRow + e == argmax[j], grad[j]));
        activated[e] = from_float<T>(relu_backward_if(to_float(pooled[e]), relu_after, after[i][e]));
        dx[e] = from_float<T>(dropped_value(activated[e], factor, true));
      }
      const int at = first + i * g.w;
      if (t.pool_grad) store_packed<B>(t.pool_grad + at, pooled);
      if (t.relu_after_grad) store_packed<B>(t.relu_after_grad + at, activated);
      if (dropout.active) store_packed<B>(t.dx + at, dx);
    }
  }
}

// How the packed kernels take a problem: V windows a thread, rows moved in
// packs of `bytes`; v == 0: not theirs (windows that overlap, leave rows or
// columns over or are not 2x2 or 3x3, or an index past 32 bits).
struct PackedShape {
  int v = 0, bytes = 0;
};

// The first V of 4, 2, 1 dividing ow whose rows of V*k elements split into
// packs wider than an element that every row of every plane-sized tensor
// (`plane_sized`, nulls skipped) starts aligned to; else one window a thread,
// element by element.
template <typename T>
PackedShape packed_shape(const PoolGeometry& g, std::initializer_list<const void*> plane_sized) {
  const bool tiles = g.kernel == g.stride && g.h == g.oh() * g.kernel && g.w == g.ow() * g.kernel;
  if (!tiles || (g.kernel != 2 && g.kernel != 3) || !fits_int32(g)) return {};
  const int size = int(sizeof(T));
  for (const int v : {4, 2, 1}) {
    if (g.ow() % v != 0) continue;
    const int bytes = widest_pack_bytes(v * int(g.kernel), size);
    if (bytes <= size || g.w * size % bytes != 0) continue;
    if (std::all_of(plane_sized.begin(), plane_sized.end(), [&](const void* p) { return aligned_to(p, bytes); }))
      return {v, bytes};
  }
  return {1, size};
}

// f(K, V, B) as std::integral_constants for the packed kernel of `shape`
// (packed_shape's choices: V's widest pack, or V = 1 element by element).
template <typename T, typename F>
void with_packed_shape(std::int64_t kernel, PackedShape shape, F&& f) {
  const auto for_k = [&](auto k) {
    constexpr int K = decltype(k)::value;
    const auto try_v = [&](auto v) {
      constexpr int V = decltype(v)::value, B = widest_pack_bytes(V * K, int(sizeof(T)));
      if constexpr (B > int(sizeof(T))) {
        if (shape.v == V && shape.bytes == B) {
          f(k, v, std::integral_constant<int, B>{});
          return true;
        }
      }
      return false;
    };
    if (try_v(std::integral_constant<int, 4>{}) || try_v(std::integral_constant<int, 2>{}) ||
        try_v(std::integral_constant<int, 1>{}))
      return;
    f(k, std::integral_constant<int, 1>{}, std::integral_constant<int, int(sizeof(T))>{});
  };
  if (kernel == 2)
    for_k(std::integral_constant<int, 2>{});
  else
    for_k(std::integral_constant<int, 3>{});
}

// Whether every tensor of the output's shape (nulls skipped) is aligned to V elements.
template <typename T>
bool out_packed(int v, std::initializer_list<const void*> out_sized) {
  const int bytes = v * int(sizeof(T));
  return std::all_of(out_sized.begin(), out_sized.end(), [&](const void* p) { return aligned_to(p, bytes); });
}

}  // namespace

template <typename T>
void launch_max_pool2d_forward(const T* x, const std::int32_t* step, const PoolGeometry& g, const PlaneDropout& dropout,
                               T* dropped, T* pooled, T* activated, cudaStream_t stream) {
  if (const PackedShape shape = packed_shape<T>(g, {x, dropped}); shape.v > 0) {
    const bool packed_out = out_packed<T>(shape.v, {pooled, activated});
    const unsigned blocks = blocks_for(g.planes * g.oh() * g.ow() / shape.v);
    with_packed_shape<T>(g.kernel, shape, [&](auto k, auto v, auto b) {
      max_pool2d_forward_packed_kernel<T, decltype(k)::value, decltype(v)::value, decltype(b)::value>
          <<<blocks, kThreads, 0, stream>>>(x, step, PoolSizes<std::int32_t>(g), dropout, dropped, pooled, activated,
                                            packed_out);
    });
    SG_LAUNCH_CHECK("max_pool2d_forward_packed_kernel");
    return;
  }
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
  if (const PackedShape shape = packed_shape<T>(g, {t.x, t.relu_after, t.pool_grad, t.relu_after_grad, t.dx});
      shape.v > 0) {
    const bool packed_out = out_packed<T>(shape.v, {t.dy, t.relu_before, t.relu_before_grad});
    const unsigned blocks = blocks_for(g.planes * g.oh() * g.ow() / shape.v);
    with_packed_shape<T>(g.kernel, shape, [&](auto k, auto v, auto b) {
      max_pool2d_backward_packed_kernel<T, decltype(k)::value, decltype(v)::value, decltype(b)::value>
          <<<blocks, kThreads, 0, stream>>>(t, step, PoolSizes<std::int32_t>(g), dropout, packed_out);
    });
    SG_LAUNCH_CHECK("max_pool2d_backward_packed_kernel");
    return;
  }
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
