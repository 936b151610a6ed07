#pragma once
// What the channels-last max-pooling kernels share (channels_last_pool.cu,
// channels_last_activation_pool.cu): the sizes in a narrow index type, where
// an output pixel's channel pack sits, V-channel loads and stores, the
// window maximum (pool_window.cuh's rule), and the launch's pack width and
// index type. See channels_last_pool.cu for the layouts and rules.
#include <initializer_list>
#include <string>
#include <type_traits>

#include "ops/cuda/channels_last.hpp"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/launch_config.cuh"
#include "ops/cuda/packed_access.cuh"
#include "ops/cuda/pool_sizes.cuh"
#include "ops/cuda/pool_window.cuh"

namespace sg::cuda::channels_last_pool {

// The problem's sizes in the index type I: 32-bit where every index fits
// (64-bit division costs several times more, and these kernels are mostly
// index arithmetic), as PoolSizes.
template <typename I>
struct NhwcSizes {
  I n, h, w, c, kernel, stride, oh, ow;
  bool pooled_first;  // ChannelsLastPool::pooled_channels_first
  explicit NhwcSizes(const ChannelsLastPool& g)
      : n(I(g.n)),
        h(I(g.h)),
        w(I(g.w)),
        c(I(g.c)),
        kernel(I(g.kernel)),
        stride(I(g.stride)),
        oh(I(g.oh())),
        ow(I(g.ow())),
        pooled_first(g.pooled_channels_first) {}
};

// Output pixel (image, oy, ox) and pack `pack` of channels: where its
// elements sit in a pooled-sized tensor, channels-last (one access of V
// elements) or channels-first (V elements a plane apart).
template <typename I>
struct PooledPack {
  I image, oy, ox, pack;
};
template <typename I>
__device__ __forceinline__ PooledPack<I> pooled_pack(const NhwcSizes<I>& g, I pixel_pack, I packs) {
  const I pixel = pixel_pack / packs, pack = pixel_pack - pixel * packs;
  const I r = pixel / g.ow, ox = pixel - r * g.ow, image = r / g.oh, oy = r - image * g.oh;
  return {image, oy, ox, pack};
}
template <int V, typename T, typename I>
__device__ __forceinline__ void load_pooled(const T* base, const NhwcSizes<I>& g, const PooledPack<I>& at, T (&v)[V]) {
  if (!g.pooled_first) {
    load_packed<V* int(sizeof(T))>(base + ((at.image * g.oh + at.oy) * g.ow + at.ox) * g.c + at.pack * V, v);
    return;
  }
  const T* p = base + ((at.image * g.c + at.pack * V) * g.oh + at.oy) * g.ow + at.ox;
#pragma unroll
  for (int e = 0; e < V; ++e) v[e] = p[e * g.oh * g.ow];
}
template <int V, typename T, typename I>
__device__ __forceinline__ void store_pooled(T* base, const NhwcSizes<I>& g, const PooledPack<I>& at, const T (&v)[V]) {
  if (!g.pooled_first) {
    store_packed<V* int(sizeof(T))>(base + ((at.image * g.oh + at.oy) * g.ow + at.ox) * g.c + at.pack * V, v);
    return;
  }
  T* p = base + ((at.image * g.c + at.pack * V) * g.oh + at.oy) * g.ow + at.ox;
#pragma unroll
  for (int e = 0; e < V; ++e) p[e * g.oh * g.ow] = v[e];
}

// V channels at p: one access of V elements (the host checked the alignment),
// or one element when V == 1.
template <int V, typename T>
__device__ __forceinline__ void load_channels(const T* p, T (&v)[V]) {
  load_packed<V* int(sizeof(T))>(p, v);
}
template <int V, typename T>
__device__ __forceinline__ void store_channels(T* p, const T (&v)[V]) {
  store_packed<V* int(sizeof(T))>(p, v);
}

// The window at `corner` (its top-left pixel's first channel of the pack),
// for V channels at once: best[e] is channel e's first maximum, pos[e] its
// pixel in the window (i * kernel + j). window_max's rule per channel, the
// pixels in the same row-major order: a NaN wins over numbers (the first of
// several), a tie keeps the earlier pixel. K > 0: the kernel is K x K, known
// here, so every load of the window is issued before the first compare (a
// loop over a run-time kernel waited for each load in turn).
template <int V, typename T>
__device__ __forceinline__ void take_if_above(const T (&raw)[V], int p, float (&best)[V], int (&pos)[V]) {
#pragma unroll
  for (int e = 0; e < V; ++e) {
    const float v = to_float(raw[e]);
    if (best[e] == best[e] && !(v <= best[e])) {  // best a number, v above it or NaN
      best[e] = v;
      pos[e] = p;
    }
  }
}
template <int K, int V, typename T, typename I>
__device__ __forceinline__ void window_max_channels(const T* corner, const NhwcSizes<I>& g, float (&best)[V],
                                                    int (&pos)[V]) {
  T first[V];
  load_channels<V>(corner, first);
#pragma unroll
  for (int e = 0; e < V; ++e) {
    best[e] = to_float(first[e]);
    pos[e] = 0;
  }
  if constexpr (K > 0) {
    T raw[K * K][V];
#pragma unroll
    for (int p = 1; p < K * K; ++p) load_channels<V>(corner + (I(p / K) * g.w + I(p % K)) * g.c, raw[p]);
#pragma unroll
    for (int p = 1; p < K * K; ++p) take_if_above<V>(raw[p], p, best, pos);
  } else {
    T raw[V];
    for (I i = 0; i < g.kernel; ++i)
      for (I j = 0; j < g.kernel; ++j) {
        load_channels<V>(corner + (i * g.w + j) * g.c, raw);
        take_if_above<V>(raw, int(i * g.kernel + j), best, pos);
      }
  }
}

// Work item q of a forward (one output pixel, one channel pack). Written
// channels-first (pooled_first), a warp takes consecutive pixels of one
// pack, so each of its V stores is a run along a plane (consecutive packs of
// a pixel, as for channels-last, spread every store over V planes: 2-byte
// writes to as many sectors).
template <typename I>
__device__ __forceinline__ PooledPack<I> output_pack(const NhwcSizes<I>& g, I q, I packs) {
  I pixel, pack;  // output pixel (image * oh + oy) * ow + ox, and the channel pack
  if (g.pooled_first) {
    const I plane = g.oh * g.ow, image = q / (plane * packs), r = q - image * plane * packs;
    pack = r / plane;
    pixel = image * plane + (r - pack * plane);
  } else {
    pixel = q / packs;
    pack = q - pixel * packs;
  }
  const I r = pixel / g.ow, ox = pixel - r * g.ow, image = r / g.oh, oy = r - image * g.oh;
  return {image, oy, ox, pack};
}

// An output pixel-pack's window maxima: pooled and relu(pooled), where asked.
// (best is one of the window's stored values: converting back is exact.)
template <int V, typename T, typename I>
__device__ __forceinline__ void store_window(const NhwcSizes<I>& g, const PooledPack<I>& at, const float (&best)[V],
                                             T* pooled, T* activated) {
  T out_pooled[V], out_activated[V];
#pragma unroll
  for (int e = 0; e < V; ++e) {
    out_pooled[e] = from_float<T>(best[e]);
    out_activated[e] = from_float<T>(best[e] > 0.f ? best[e] : 0.f);  // ref::relu (NaN -> 0)
  }
  if (pooled) store_pooled<V>(pooled, g, at, out_pooled);
  if (activated) store_pooled<V>(activated, g, at, out_activated);
}

inline void check_geometry(const ChannelsLastPool& g, const char* what) {
  if (g.n < 0 || g.h < 1 || g.w < 1 || g.c < 1 || g.kernel < 1 || g.stride < 1 || g.kernel > g.h || g.kernel > g.w)
    throw CudaError(std::string(what) + ": needs n >= 0, c >= 1, kernel and stride >= 1, kernel <= h and w");
}

// f(std::integral_constant<int, V>{}, I{}) for the widest V (16 bytes of
// channels, else 1) that c and every pointer (nulls skipped) allow, and the
// narrowest index type.
template <typename T, typename F>
inline void with_pack_and_index(const ChannelsLastPool& g, std::initializer_list<const void*> tensors, F&& f) {
  constexpr int kWide = kVec<T>;
  bool wide = g.c % kWide == 0;
  for (const void* p : tensors) wide = wide && (p == nullptr || aligned_to(p, 16));
  const auto with_index = [&](auto v) {
    if (fits_int32(g.n * g.h * g.w * g.c))
      f(v, std::int32_t{});
    else
      f(v, std::int64_t{});
  };
  if (wide)
    with_index(std::integral_constant<int, kWide>{});
  else
    with_index(std::integral_constant<int, 1>{});
}

}  // namespace sg::cuda::channels_last_pool
