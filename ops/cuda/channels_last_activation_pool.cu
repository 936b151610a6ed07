// The activation before a channels-last max pooling in the same pass
// (channels_last.hpp: launch_activation_max_pool2d_nhwc_forward), on windows
// that tile the input exactly: a thread loads its window of the activation's
// input z, writes act(z) rounded to T (each input element by exactly one
// thread, activation.cuh's math as the element-wise kernel's) and pools
// those values by the forward's rules (channels_last_pool.cu). The
// element-wise launch before the pooling, and its output's second read, go.
#include "ops/cuda/activation.cuh"
#include "ops/cuda/channels_last_pool.cuh"

namespace sg::cuda {
namespace {

using namespace channels_last_pool;

// Window pixel p's V values of z: act(z) rounded to T, stored at `out` (when not null) and
// taken into the window's maximum (window_max's rule, pixel 0 first).
template <int V, typename T>
__device__ __forceinline__ void activate_and_take(Activation act, T (&raw)[V], T* out, int p, float (&best)[V],
                                                  int (&pos)[V]) {
  with_activation(act, [&](auto a) {
#pragma unroll
    for (int e = 0; e < V; ++e) raw[e] = from_float<T>(ActivationMath<decltype(a)::value>::forward(to_float(raw[e])));
  });
  if (out) store_channels<V>(out, raw);
  if (p > 0) {
    take_if_above<V>(raw, p, best, pos);
    return;
  }
#pragma unroll
  for (int e = 0; e < V; ++e) {
    best[e] = to_float(raw[e]);
    pos[e] = 0;
  }
}

// Where a window pixel's activation output goes: nowhere when the caller asked for none (an offset from
// a null pointer is not null).
template <typename T, typename I>
__device__ __forceinline__ T* at_pixel(T* out, I offset) {
  return out ? out + offset : nullptr;
}

// One thread per output pixel and channel pack (output_pack's order).
template <typename T, int V, typename I, int K>
__global__ void __launch_bounds__(kThreads)
    activation_max_pool2d_nhwc_forward_kernel(const T* z, Activation act, NhwcSizes<I> g, T* activated_input,
                                              T* pooled, T* activated) {
  const I packs = g.c / V, total = g.n * g.oh * g.ow * packs, k = K > 0 ? I(K) : g.kernel;
  const I stride = I(gridDim.x) * I(blockDim.x);
  for (I q = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); q < total; q += stride) {
    const PooledPack<I> at = output_pack(g, q, packs);
    const I corner = ((at.image * g.h + at.oy * k) * g.w + at.ox * k) * g.c + at.pack * V;
    float best[V];
    int pos[V];
    if constexpr (K > 0) {
      // The whole window's loads issued before the first store (z and the output may not be told apart).
      T raw[K * K][V];
#pragma unroll
      for (int p = 0; p < K * K; ++p) load_channels<V>(z + corner + (I(p / K) * g.w + I(p % K)) * g.c, raw[p]);
#pragma unroll
      for (int p = 0; p < K * K; ++p)
        activate_and_take<V>(act, raw[p], at_pixel(activated_input, corner + (I(p / K) * g.w + I(p % K)) * g.c), p,
                             best, pos);
    } else {
      for (I i = 0; i < k; ++i)
        for (I j = 0; j < k; ++j) {
          T raw[V];
          load_channels<V>(z + corner + (i * g.w + j) * g.c, raw);
          activate_and_take<V>(act, raw, at_pixel(activated_input, corner + (i * g.w + j) * g.c), int(i * k + j), best,
                               pos);
        }
    }
    store_window<V>(g, at, best, pooled, activated);
  }
}

}  // namespace

template <typename T>
void launch_activation_max_pool2d_nhwc_forward(const T* z, Activation act, const ChannelsLastPool& g,
                                               T* activated_input, T* pooled, T* activated, cudaStream_t stream) {
  check_geometry(g, "activation_max_pool2d_nhwc_forward");
  if (!activation_pool_tiles(g)) throw CudaError("activation_max_pool2d_nhwc_forward: windows must tile the input");
  if (g.n == 0) return;
  with_pack_and_index<T>(g, {z, activated_input, pooled, activated}, [&](auto v, auto index) {
    constexpr int V = decltype(v)::value;
    using I = decltype(index);
    const unsigned blocks = blocks_for(g.n * g.oh() * g.ow() * (g.c / V));
    const NhwcSizes<I> sizes(g);
    if (g.kernel == 2)
      activation_max_pool2d_nhwc_forward_kernel<T, V, I, 2>
          <<<blocks, kThreads, 0, stream>>>(z, act, sizes, activated_input, pooled, activated);
    else
      activation_max_pool2d_nhwc_forward_kernel<T, V, I, 0>
          <<<blocks, kThreads, 0, stream>>>(z, act, sizes, activated_input, pooled, activated);
  });
  SG_LAUNCH_CHECK("activation_max_pool2d_nhwc_forward_kernel");
}

#define SG_INSTANTIATE_ACTIVATION_POOLING(T)                                                                   \
  template void launch_activation_max_pool2d_nhwc_forward<T>(const T*, Activation, const ChannelsLastPool&, T*, \
                                                             T*, T*, cudaStream_t);
SG_INSTANTIATE_ACTIVATION_POOLING(float)
SG_INSTANTIATE_ACTIVATION_POOLING(__half)
SG_INSTANTIATE_ACTIVATION_POOLING(__nv_bfloat16)
#undef SG_INSTANTIATE_ACTIVATION_POOLING

}  // namespace sg::cuda
