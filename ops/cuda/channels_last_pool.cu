// Max pooling of channels-last tensors (see channels_last.hpp). A thread
// takes one pixel (an output pixel forward, a window or an input pixel
// backward) and V consecutive channels of it: consecutive threads take
// consecutive channel packs, so a warp reads a pixel's channels (and the
// next pixels') as contiguous runs, and each (n, c) plane is pooled by the
// rules of the NCHW kernels (pooling.cu): a channel's window maximum is
// window_max's rule (pool_window.cuh) over the window's pixels in row-major
// order, overlapping windows add in (oy, ox) order in f32, and every step of
// the chain is rounded to T as the graph stores it. V is 16 bytes of
// channels when c and every pointer allow, else 1 (element by element).
//
// The backward has two forms. Windows at stride == kernel never overlap: one
// thread per window finds each channel's argmax once and SCATTERS the
// window's gradient (0 + the one gradient at the argmax, 0 elsewhere: the
// gather's f32 sum) over its k x k pixels; the last window of a row (column)
// also writes the pixels past it that no window covers, so every input pixel
// is written by exactly one thread. Overlapping (or gapped) windows GATHER:
// one thread per input pixel adds the gradients of the windows that contain
// it and whose argmax it is, in (oy, ox) order (no atomics, no zero pass).
#include <initializer_list>
#include <string>
#include <type_traits>

#include "ops/cuda/activation.cuh"
#include "ops/cuda/channels_last_pool.cuh"

namespace sg::cuda {
namespace {

using namespace channels_last_pool;

// The gradient reaching output pixel-pack `at`: dy through the relu after
// the pooling, where there is one (relu_before).
template <int V, typename T, typename I>
__device__ __forceinline__ void output_grad(const ChannelsLastPoolBackward<T>& t, const NhwcSizes<I>& g,
                                            const PooledPack<I>& at, float (&grad)[V]) {
  T dy[V], gate[V] = {};
  load_pooled<V>(t.dy, g, at, dy);
  if (t.relu_before) load_pooled<V>(t.relu_before, g, at, gate);
#pragma unroll
  for (int e = 0; e < V; ++e) grad[e] = relu_backward_if(to_float(dy[e]), t.relu_before != nullptr, gate[e]);
}

// The rest of the chain at input element `at` (V channels): the pooling's
// gradient `sum` rounded to T, then the backward of the activation before
// the pooling (relu_after: a ReLU's, or after_activation's; the ReLU's rule
// is ref::relu_backward's, NaN included), each written where asked.
// (`after`: the relu's outputs at `at`, loaded by the caller.)
template <int V, typename T, typename I>
__device__ __forceinline__ void finish_input(const ChannelsLastPoolBackward<T>& t, I at, const float (&sum)[V],
                                             const T (&after)[V]) {
  T pooled[V], activated[V];
#pragma unroll
  for (int e = 0; e < V; ++e) pooled[e] = from_float<T>(sum[e]);
  if (t.relu_after) {
    with_activation(t.after_activation, [&](auto a) {
#pragma unroll
      for (int e = 0; e < V; ++e)
        activated[e] =
            from_float<T>(ActivationMath<decltype(a)::value>::backward(to_float(pooled[e]), to_float(after[e])));
    });
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) activated[e] = pooled[e];
  }
  if (t.pool_grad) store_channels<V>(t.pool_grad + at, pooled);
  if (t.relu_after_grad) store_channels<V>(t.relu_after_grad + at, activated);
}
template <int V, typename T, typename I>
__device__ __forceinline__ void finish_input(const ChannelsLastPoolBackward<T>& t, I at, const float (&sum)[V]) {
  T after[V] = {};
  if (t.relu_after) load_channels<V>(t.relu_after + at, after);
  finish_input<V>(t, at, sum, after);
}

// One thread per output pixel and channel pack. Written channels-first
// (pooled_first), a warp takes consecutive pixels of one pack, so each of
// its V stores is a run along a plane (taking consecutive packs of a pixel,
// as for channels-last, spread every store over V planes: 2-byte writes to
// as many sectors); K: window_max_channels.
template <typename T, int V, typename I, int K>
__global__ void __launch_bounds__(kThreads)
    max_pool2d_nhwc_forward_kernel(const T* x, NhwcSizes<I> g, T* pooled, T* activated) {
  const I packs = g.c / V, total = g.n * g.oh * g.ow * packs;
  const I stride = I(gridDim.x) * I(blockDim.x);
  for (I q = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); q < total; q += stride) {
    const PooledPack<I> at = output_pack(g, q, packs);
    const I image = at.image, oy = at.oy, ox = at.ox, pack = at.pack;
    float best[V];
    int pos[V];
    window_max_channels<K, V>(x + ((image * g.h + oy * g.stride) * g.w + ox * g.stride) * g.c + pack * V, g, best,
                              pos);
    store_window<V>(g, at, best, pooled, activated);
  }
}

// kernel == stride: one thread per window and channel pack, scattering (see
// the top). A thread reads all it needs of its pixels before it writes them,
// and writes only its own: a result written over its input (a planned buffer
// reused in place) stays right.
template <typename T, int V, typename I, int K>
__global__ void __launch_bounds__(kThreads)
    max_pool2d_nhwc_backward_tiled_kernel(ChannelsLastPoolBackward<T> t, NhwcSizes<I> g) {
  const I packs = g.c / V, total = g.n * g.oh * g.ow * packs, k = K > 0 ? I(K) : g.kernel;
  const I stride = I(gridDim.x) * I(blockDim.x);
  for (I q = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); q < total; q += stride) {
    const I pixel = q / packs, pack = q - pixel * packs;
    const I r = pixel / g.ow, ox = pixel - r * g.ow, image = r / g.oh, oy = r - image * g.oh;
    const PooledPack<I> at{image, oy, ox, pack};
    float grad[V];
    output_grad<V>(t, g, at, grad);
    if (t.relu_before_grad) {
      T out[V];
#pragma unroll
      for (int e = 0; e < V; ++e) out[e] = from_float<T>(grad[e]);
      store_pooled<V>(t.relu_before_grad, g, at, out);
    }
    const I corner = ((image * g.h + oy * k) * g.w + ox * k) * g.c + pack * V;
    float best[V];
    int pos[V];
    window_max_channels<K, V>(t.x + corner, g, best, pos);
    // The window's pixels, and for the last window of a row (column) the
    // columns (rows) after it that no window covers.
    const I rows = oy == g.oh - 1 ? g.h - oy * k : k, cols = ox == g.ow - 1 ? g.w - ox * k : k;
    if constexpr (K > 0) {
      if (rows == k && cols == k) {
        // A known window and nothing past it: the relu's outputs at all its
        // pixels loaded before the first store (every read before any write, as below).
        T after[K * K][V] = {};
        if (t.relu_after)
#pragma unroll
          for (int p = 0; p < K * K; ++p)
            load_channels<V>(t.relu_after + corner + (I(p / K) * g.w + I(p % K)) * g.c, after[p]);
#pragma unroll
        for (int p = 0; p < K * K; ++p) {
          float sum[V];
#pragma unroll
          for (int e = 0; e < V; ++e) sum[e] = tiled_window_gradient(p == pos[e], grad[e]);
          finish_input<V>(t, corner + (I(p / K) * g.w + I(p % K)) * g.c, sum, after[p]);
        }
        continue;
      }
    }
    for (I i = 0; i < rows; ++i)
      for (I j = 0; j < cols; ++j) {
        const bool inside = i < k && j < k;
        const int p = int(i * k + j);
        float sum[V];
#pragma unroll
        for (int e = 0; e < V; ++e) sum[e] = tiled_window_gradient(inside && p == pos[e], grad[e]);
        finish_input<V>(t, corner + (i * g.w + j) * g.c, sum);
      }
  }
}

// Any windows: one thread per input pixel and channel pack, gathering (see
// the top). It reads x around its pixel, so x may not share a buffer with a
// result here.
template <typename T, int V, typename I>
__global__ void __launch_bounds__(kThreads)
    max_pool2d_nhwc_backward_kernel(ChannelsLastPoolBackward<T> t, NhwcSizes<I> g) {
  const I packs = g.c / V;
  const I stride = I(gridDim.x) * I(blockDim.x);
  const I first = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x);
  if (t.relu_before_grad)  // the first relu_backward's output, when read after the launch
    for (I o = first; o < g.n * g.oh * g.ow * packs; o += stride) {
      const PooledPack<I> at = pooled_pack(g, o, packs);
      float grad[V];
      T out[V];
      output_grad<V>(t, g, at, grad);
#pragma unroll
      for (int e = 0; e < V; ++e) out[e] = from_float<T>(grad[e]);
      store_pooled<V>(t.relu_before_grad, g, at, out);
    }
  for (I q = first; q < g.n * g.h * g.w * packs; q += stride) {
    const I pixel = q / packs, pack = q - pixel * packs;  // input pixel (image * h + y) * w + xx
    const I r = pixel / g.w, xx = pixel - r * g.w, image = r / g.h, y = r - image * g.h;
    const WindowRange<I> rows = windows_containing(y, g.kernel, g.stride, g.oh);
    const WindowRange<I> cols = windows_containing(xx, g.kernel, g.stride, g.ow);
    float sum[V] = {};
    for (I oy = rows.lo; oy <= rows.hi; ++oy)
      for (I ox = cols.lo; ox <= cols.hi; ++ox) {
        float best[V];
        int pos[V];
        window_max_channels<0, V>(t.x + ((image * g.h + oy * g.stride) * g.w + ox * g.stride) * g.c + pack * V, g,
                                  best, pos);
        const int here = int((y - oy * g.stride) * g.kernel + (xx - ox * g.stride));  // this pixel in the window
        bool any = false;
#pragma unroll
        for (int e = 0; e < V; ++e) any = any || pos[e] == here;
        if (!any) continue;  // no channel's argmax: dy not needed
        float grad[V];
        output_grad<V>(t, g, PooledPack<I>{image, oy, ox, pack}, grad);
#pragma unroll
        for (int e = 0; e < V; ++e)
          if (pos[e] == here) sum[e] += grad[e];
      }
    finish_input<V>(t, q * V, sum);
  }
}

}  // namespace

template <typename T>
void launch_max_pool2d_nhwc_forward(const T* x, const ChannelsLastPool& g, T* pooled, T* activated,
                                    cudaStream_t stream) {
  check_geometry(g, "max_pool2d_nhwc_forward");
  if (!pooled && !activated) throw CudaError("max_pool2d_nhwc_forward: no output");
  if (g.n == 0) return;
  with_pack_and_index<T>(g, {x, pooled, activated}, [&](auto v, auto index) {
    constexpr int V = decltype(v)::value;
    using I = decltype(index);
    const unsigned blocks = blocks_for(g.n * g.oh() * g.ow() * (g.c / V));
    const NhwcSizes<I> sizes(g);
    if (g.kernel == 2)
      max_pool2d_nhwc_forward_kernel<T, V, I, 2><<<blocks, kThreads, 0, stream>>>(x, sizes, pooled, activated);
    else
      max_pool2d_nhwc_forward_kernel<T, V, I, 0><<<blocks, kThreads, 0, stream>>>(x, sizes, pooled, activated);
  });
  SG_LAUNCH_CHECK("max_pool2d_nhwc_forward_kernel");
}

template <typename T>
void launch_max_pool2d_nhwc_backward(const ChannelsLastPoolBackward<T>& t, const ChannelsLastPool& g,
                                     cudaStream_t stream) {
  check_geometry(g, "max_pool2d_nhwc_backward");
  // Without a dropout after it the chain ends at the pooling's gradient, or
  // at the relu_backward after it when there is one.
  if (t.dx == nullptr || t.dx != (t.relu_after ? t.relu_after_grad : t.pool_grad))
    throw CudaError(
        "max_pool2d_nhwc_backward: dx must be the chain's result (relu_after_grad with a relu_after, "
        "else pool_grad)");
  if (g.n == 0) return;
  const bool tiled = g.kernel == g.stride;
  const auto run = [&](auto v, auto index) {
    constexpr int V = decltype(v)::value;
    using I = decltype(index);
    const unsigned blocks = blocks_for((tiled ? g.n * g.oh() * g.ow() : g.n * g.h * g.w) * (g.c / V));
    if (tiled && g.kernel == 2)
      max_pool2d_nhwc_backward_tiled_kernel<T, V, I, 2><<<blocks, kThreads, 0, stream>>>(t, NhwcSizes<I>(g));
    else if (tiled)
      max_pool2d_nhwc_backward_tiled_kernel<T, V, I, 0><<<blocks, kThreads, 0, stream>>>(t, NhwcSizes<I>(g));
    else
      max_pool2d_nhwc_backward_kernel<T, V, I><<<blocks, kThreads, 0, stream>>>(t, NhwcSizes<I>(g));
  };
  with_pack_and_index<T>(
      g, {t.dy, t.relu_before, t.x, t.relu_after, t.relu_before_grad, t.pool_grad, t.relu_after_grad}, run);
  SG_LAUNCH_CHECK(tiled ? "max_pool2d_nhwc_backward_tiled_kernel" : "max_pool2d_nhwc_backward_kernel");
}

#define SG_INSTANTIATE_NHWC_POOLING(T)                                                                          \
  template void launch_max_pool2d_nhwc_forward<T>(const T*, const ChannelsLastPool&, T*, T*, cudaStream_t);     \
  template void launch_max_pool2d_nhwc_backward<T>(const ChannelsLastPoolBackward<T>&, const ChannelsLastPool&, \
                                                   cudaStream_t);
SG_INSTANTIATE_NHWC_POOLING(float)
SG_INSTANTIATE_NHWC_POOLING(__half)
SG_INSTANTIATE_NHWC_POOLING(__nv_bfloat16)
#undef SG_INSTANTIATE_NHWC_POOLING

}  // namespace sg::cuda
