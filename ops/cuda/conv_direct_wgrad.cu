// The direct convolution's weight gradient (conv_direct.hpp; when it runs:
// conv_implicit_gemm.hpp): blocks (items, image group, row split) add their
// images' products into ordered f32 partials of dW, which a second kernel
// adds in a fixed order, so every run gives the same bits. With the plan's
// bias_gradient, each channel group has one more item, the bias, whose
// input is 1: db comes from the same staged dY in the same pass.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "ops/cuda/conv_direct.hpp"
#include "ops/cuda/conv_direct_common.cuh"
#include "ops/cuda/wgrad_partials.cuh"

namespace sg::cuda::conv_direct {
namespace {

// Backward filter. Items are (channel group og, c, i, j), og major (and
// (og, bias) after og's taps when the plan has the bias gradient); block
// (chunk, image group, row split) owns items [chunk*per_chunk, +per_chunk)
// for the images of its group and the output rows oy = z*slices + slice +
// k*slices*row_splits, thread (slice, item) the rows of its slice. The block
// stages dY of one image for those rows only (local row k*slices + slice)
// and its channel groups only, transposed, sdy[local pixel][staged channel]
// (G channels in one vector load), then the x window; the slices' sums are
// added in slice order and the block writes
// partials[image group][row split][o][c][i][j] (then [o][bias]).
struct WgradDims {
  DirectDims d;   // ci = c, co = o, pad_h = pad_w = padding
  int per_group;  // items per channel group: ci * kh * kw taps, + 1 with the bias
  int items, per_chunk, slices, image_group, row_splits;
  int staged;         // dY channels staged, a multiple of 4
  int sdy_stride;     // floats from one staged pixel to the next (sdy_stride())
  int staged_pixels;  // the most local pixels a row split stages (split 0's)
  bool dy_last;       // dY is [n, oh, ow, o] (ConvShape::dy_channels_last)
};

// How many output rows of `oh` row split z owns: blocks of `slices`
// consecutive rows dealt round-robin to the `row_splits` splits (split 0
// owns the most).
__host__ __device__ inline int split_rows(int oh, int slices, int row_splits, int z) {
  int rows = 0;
  for (int b = z; b * slices < oh; b += row_splits) rows += slices < oh - b * slices ? slices : oh - b * slices;
  return rows;
}

// The floats from one staged dY pixel to the next for `staged` channels (a
// multiple of 4): an odd number of float4s, so stage_dy_rows' float4 stores
// of 8 consecutive pixels (one phase of a warp's store) hit 8 distinct bank
// quads, where a stride of 32 floats put a warp's 32 stores in one bank.
__host__ __device__ inline int sdy_stride(int staged) { return staged / 4 % 2 == 1 ? staged : staged + 4; }

// dY of one image (dyi), channels [o_first, o_first + staged) of this row
// split's rows into sdy: each thread loads one pixel of 4 channels (a warp's
// 2-byte loads run along a row: coalesced; channels-last, the 4 channels are
// adjacent) and stores them as one float4.
template <typename T>
__device__ __forceinline__ void stage_dy_rows(const T* dyi, const WgradDims& wd, int o_first, int local_pixels,
                                              float* sdy) {
  // Pixels per thread at a time, 4 loads each: a block stages a few thousand
  // pixels, and with 2 in flight it waited out a dozen load latencies in turn
  // (docs/benchmarks.md: mnist_cnn_fast's first layer).
  constexpr int kInFlight = 8;
  const DirectDims& d = wd.d;
  const int pixels = d.oh * d.ow, quads = wd.staged / 4, total = local_pixels * quads;
  for (int base = threadIdx.x; base < total; base += kInFlight * blockDim.x) {
    float4 v[kInFlight];
    int at[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int e = base + u * blockDim.x;
      at[u] = -1;
      if (e >= total) continue;
      const int quad = e / local_pixels, lp = e - quad * local_pixels, lr = lp / d.ow, ox = lp - lr * d.ow;
      const int oy = (blockIdx.z + (lr / wd.slices) * wd.row_splits) * wd.slices + lr % wd.slices;
      const int o = o_first + 4 * quad;
      const int next = wd.dy_last ? 1 : pixels;  // from one channel to the next
      const T* src = wd.dy_last ? dyi + (oy * d.ow + ox) * d.co + o : dyi + o * pixels + oy * d.ow + ox;
      v[u].x = o < d.co ? to_float(src[0]) : 0.f;
      v[u].y = o + 1 < d.co ? to_float(src[next]) : 0.f;
      v[u].z = o + 2 < d.co ? to_float(src[2 * next]) : 0.f;
      v[u].w = o + 3 < d.co ? to_float(src[3 * next]) : 0.f;
      at[u] = lp * wd.sdy_stride + 4 * quad;
    }
#pragma unroll
    for (int u = 0; u < kInFlight; ++u)
      if (at[u] >= 0) *reinterpret_cast<float4*>(sdy + at[u]) = v[u];
  }
}

template <int G, int K, typename T>
__global__ void __launch_bounds__(kDirectThreads)
    direct_wgrad_kernel(WgradDims wd, const T* dy, const T* x, float* partials) {
  extern __shared__ float4 direct_shared[];
  const DirectDims& d = wd.d;
  const int kh = K > 0 ? K : d.kh, kw = K > 0 ? K : d.kw, taps = kh * kw, ckk = d.ci * taps;
  const int per_group = wd.per_group;
  const int pixels = d.oh * d.ow, window = d.ph * d.pw;
  float* sdy = reinterpret_cast<float*>(direct_shared);
  float* sx = sdy + wd.staged_pixels * wd.sdy_stride;
  float* sums = sx + d.ci * window;  // [slices][per_chunk][G]
  const int li = threadIdx.x % wd.per_chunk, slice = threadIdx.x / wd.per_chunk;
  const int item = blockIdx.x * wd.per_chunk + li;
  const int o_staged = (blockIdx.x * wd.per_chunk) / per_group * G;  // the first staged channel
  const bool active = slice < wd.slices && item < wd.items;
  const int og = active ? item / per_group : 0, cij = active ? item - og * per_group : 0;
  const bool bias_item = cij == ckk;  // its input is 1 (the bias gradient)
  const int tap = bias_item ? 0 : cij;
  const int c = tap / taps, t = tap - c * taps, i = t / kw, j = t - i * kw;
  const float* xbase = sx + c * window + i * d.pw + j;
  const float* dybase = sdy + (active ? og * G - o_staged : 0);
  const int first_row = blockIdx.z * wd.slices + slice, row_step = wd.slices * wd.row_splits;
  const int local_pixels = split_rows(d.oh, wd.slices, wd.row_splits, blockIdx.z) * d.ow;
  float acc[G];
#pragma unroll
  for (int g = 0; g < G; ++g) acc[g] = 0.f;
  const int image_begin = blockIdx.y * wd.image_group;
  const int image_end = min(image_begin + wd.image_group, d.n);
  for (int image = image_begin; image < image_end; ++image) {
    stage_dy_rows(dy + image * d.co * pixels, wd, o_staged, local_pixels, sdy);
    stage_window(x + image * (d.ci * d.ih * d.iw), d.ci, d.ih, d.iw, d.pad_h, d.pad_w, d.ph, d.pw, sx);
    __syncthreads();
    if (active)
      for (int oy = first_row, lr = slice; oy < d.oh; oy += row_step, lr += wd.slices) {
        const float* xr = xbase + oy * d.stride * d.pw;
        const float* dr = dybase + lr * d.ow * wd.sdy_stride;
        for (int ox = 0; ox < d.ow; ++ox) {
          const float xv = bias_item ? 1.f : xr[ox * d.stride];
          float g[G];
          load_group<G>(dr + ox * wd.sdy_stride, g);
#pragma unroll
          for (int q = 0; q < G; ++q) acc[q] = fmaf(g[q], xv, acc[q]);
        }
      }
    __syncthreads();
  }
  if (slice < wd.slices)
#pragma unroll
    for (int q = 0; q < G; ++q) sums[(slice * wd.per_chunk + li) * G + q] = acc[q];
  __syncthreads();
  if (slice != 0 || item >= wd.items) return;
  float* part = partials + (blockIdx.y * wd.row_splits + blockIdx.z) * (d.co * per_group);
#pragma unroll
  for (int q = 0; q < G; ++q) {
    float v = sums[li * G + q];
    for (int s = 1; s < wd.slices; ++s) v += sums[(s * wd.per_chunk + li) * G + q];
    if (og * G + q < d.co) part[(og * G + q) * per_group + cij] = v;
  }
}

DirectDims direct_wgrad_dims(const ConvShape& s) {
  const int oh = int(s.oh()), ow = int(s.ow()), st = int(s.stride), kh = int(s.kh), kw = int(s.kw);
  return {int(s.n), int(s.c), int(s.h), int(s.w), int(s.o), kh, kw, st, int(s.padding), int(s.padding), oh, ow,
          (oh - 1) * st + kh, (ow - 1) * st + kw};
}

}  // namespace

bool plan_wgrad(ImplicitGemmPlan& plan, int multiprocessors) {
  const ConvShape& s = plan.shape;
  const DirectDims d = direct_wgrad_dims(s);
  plan.group = pick_group(d.co, 1, 1);
  // Items per channel group: its taps (+ the bias).
  const std::int64_t per_group = std::int64_t(d.ci) * d.kh * d.kw + (plan.bias_gradient ? 1 : 0);
  const std::int64_t groups = (d.co + plan.group - 1) / plan.group, items = groups * per_group;
  const std::int64_t window = std::int64_t(d.ci) * d.ph * d.pw;
  // The launch for `per_chunk` items per block staging `staged` dY
  // channels; returns the shared memory it needs.
  auto configure = [&](std::int64_t per_chunk, std::int64_t staged) {
    plan.per_chunk = static_cast<int>(per_chunk);
    plan.staged_channels = static_cast<int>((staged + 3) / 4 * 4);
    plan.item_chunks = static_cast<int>((items + per_chunk - 1) / per_chunk);
    plan.slices = static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(256 / per_chunk, d.oh)));
    plan.threads = round_warp(per_chunk * plan.slices);
    const std::int64_t base = std::int64_t(plan.item_chunks) * d.n;
    plan.image_group = static_cast<int>(std::max<std::int64_t>(1, base / (4 * std::int64_t(multiprocessors))));
    const std::int64_t rows_per_split = std::max(1, d.oh / plan.slices);
    plan.row_splits = static_cast<int>(
        std::clamp<std::int64_t>((multiprocessors + base - 1) / base, 1, std::min<std::int64_t>(rows_per_split, 8)));
    const std::int64_t staged_pixels = std::int64_t(split_rows(d.oh, plan.slices, plan.row_splits, 0)) * d.ow;
    const std::int64_t sums = std::int64_t(plan.slices) * per_chunk * plan.group;
    return (staged_pixels * sdy_stride(plan.staged_channels) + window + sums) * std::int64_t(sizeof(float));
  };
  // Items per block: whole channel groups when they are short (<= 256
  // items; as many as shared memory takes), else 256 items (two groups at most).
  std::int64_t shared = 0;
  if (per_group <= 256) {
    for (std::int64_t whole = std::min<std::int64_t>(groups, 256 / per_group); whole >= 1; --whole) {
      shared = configure(whole * per_group, whole * plan.group);
      if (shared <= kDirectMaxShared) break;
    }
  } else {
    shared = configure(256, 2 * plan.group);
  }
  const std::int64_t image_groups = (d.n + plan.image_group - 1) / plan.image_group;
  if (shared > kDirectMaxShared || !fits_int(image_groups * plan.row_splits * d.co * per_group)) return false;
  plan.shared_bytes = static_cast<int>(shared);
  plan.direct = true;
  plan_wgrad_mma(plan, multiprocessors);
  return true;
}

std::int64_t wgrad_parts(const ImplicitGemmPlan& plan) {
  return (plan.shape.n + plan.image_group - 1) / plan.image_group * plan.row_splits;
}

namespace {

template <int G, typename T>
void run_direct_wgrad_g(const ImplicitGemmPlan& plan, const WgradDims& wd, const T* dy, const T* x, float* partials,
                        cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(plan.item_chunks),
                  static_cast<unsigned>((wd.d.n + plan.image_group - 1) / plan.image_group),
                  static_cast<unsigned>(plan.row_splits));
  if (wd.d.kh == 5 && wd.d.kw == 5) {
    allow_shared(direct_wgrad_kernel<G, 5, T>, plan.shared_bytes);
    direct_wgrad_kernel<G, 5, T><<<grid, plan.threads, plan.shared_bytes, stream>>>(wd, dy, x, partials);
  } else {
    allow_shared(direct_wgrad_kernel<G, 0, T>, plan.shared_bytes);
    direct_wgrad_kernel<G, 0, T><<<grid, plan.threads, plan.shared_bytes, stream>>>(wd, dy, x, partials);
  }
  SG_LAUNCH_CHECK("direct_wgrad_kernel");
}

}  // namespace

template <typename T>
void launch_wgrad(const ImplicitGemmPlan& plan, const T* dy, const T* x, T* dw, ConvBiasGradient bias,
                  float* workspace, cudaStream_t stream) {
  if (!workspace) throw CudaError("direct conv weight gradient: needs its workspace");
  const ConvShape& s = plan.shape;
  const std::int64_t ckk = s.c * s.kh * s.kw, per_group = ckk + (plan.bias_gradient ? 1 : 0);
  const std::int64_t items = (s.o + plan.group - 1) / plan.group * per_group;
  const DirectDims d = direct_wgrad_dims(s);
  const WgradDims wd{d,
                     static_cast<int>(per_group),
                     static_cast<int>(items),
                     plan.per_chunk,
                     plan.slices,
                     plan.image_group,
                     plan.row_splits,
                     plan.staged_channels,
                     sdy_stride(plan.staged_channels),
                     split_rows(d.oh, plan.slices, plan.row_splits, 0) * d.ow,
                     s.dy_channels_last};
  // f16 / bf16 on tensor cores where the plan has that kernel.
  bool tensor_cores = false;
  if constexpr (!std::is_same_v<T, float>) {
    tensor_cores = plan.mma.usable;
    if (tensor_cores) launch_wgrad_mma(plan, dy, x, workspace, stream);
  }
  if (!tensor_cores) {
    if (plan.group == 8) run_direct_wgrad_g<8>(plan, wd, dy, x, workspace, stream);
    else if (plan.group == 4) run_direct_wgrad_g<4>(plan, wd, dy, x, workspace, stream);
    else run_direct_wgrad_g<2>(plan, wd, dy, x, workspace, stream);
  }
  const int elements = static_cast<int>(s.o * per_group);
  const int parts = static_cast<int>(tensor_cores ? mma_wgrad_parts(plan) : wgrad_parts(plan));
  if (bias.widened)
    launch_wgrad_partials_finish(workspace, parts, elements, int(per_group), int(ckk), dw,
                                 static_cast<float*>(bias.sums), stream);
  else
    launch_wgrad_partials_finish(workspace, parts, elements, int(per_group), int(ckk), dw, static_cast<T*>(bias.sums),
                                 stream);
  SG_LAUNCH_CHECK("wgrad_partials_finish");
}

template void launch_wgrad<float>(const ImplicitGemmPlan&, const float*, const float*, float*, ConvBiasGradient,
                                  float*, cudaStream_t);
template void launch_wgrad<__half>(const ImplicitGemmPlan&, const __half*, const __half*, __half*, ConvBiasGradient,
                                   float*, cudaStream_t);
template void launch_wgrad<__nv_bfloat16>(const ImplicitGemmPlan&, const __nv_bfloat16*, const __nv_bfloat16*,
                                          __nv_bfloat16*, ConvBiasGradient, float*, cudaStream_t);

}  // namespace sg::cuda::conv_direct
