// The direct convolution kernels (conv_direct.hpp; when they run:
// conv_implicit_gemm.hpp). Forward and backward data: a block stages one
// image's zero-padded input planes and its channel groups' filters in shared
// memory as f32 and each thread computes G output channels of its pixels in
// registers. Weight gradient: blocks (items, image group, row slice) add their
// images' products into ordered f32 partials of dW, which a second kernel adds
// in a fixed order, so every run gives the same bits.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "ops/cuda/conv_direct.hpp"
#include "ops/cuda/conv_window.cuh"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/launch_config.cuh"

namespace sg::cuda::conv_direct {
namespace {

constexpr int kDirectThreads = 512;
constexpr int kDirectMaxShared = 100 * 1024;  // two blocks per multiprocessor still fit

// One image's input planes [ci, ih, iw] -> output planes [co, oh, ow]. The
// staged window is ph x pw per input channel: the zero-padded rows and
// columns the outputs read (window (py, px) is input (py - pad_h, px - pad_w)).
struct DirectDims {
  int n, ci, ih, iw, co, kh, kw, stride, pad_h, pad_w, oh, ow, ph, pw;
};

// G consecutive f32 from shared memory (16- or 8-byte aligned: offsets are multiples of G).
template <int G>
__device__ __forceinline__ void load_group(const float* p, float (&v)[G]) {
  if constexpr (G % 4 == 0) {
#pragma unroll
    for (int g = 0; g < G; g += 4) {
      const float4 q = *reinterpret_cast<const float4*>(p + g);
      v[g] = q.x;
      v[g + 1] = q.y;
      v[g + 2] = q.z;
      v[g + 3] = q.w;
    }
  } else {
#pragma unroll
    for (int g = 0; g < G; g += 2) {
      const float2 q = *reinterpret_cast<const float2*>(p + g);
      v[g] = q.x;
      v[g + 1] = q.y;
    }
  }
}

// store(e, value(e)) for e < total, by the whole block, 8 global loads in
// flight per thread before the stores (few threads per block: one load at a
// time would leave the block waiting out each load's latency in turn).
template <typename Value, typename Store>
__device__ __forceinline__ void stage(int total, Value value, Store store) {
  constexpr int kInFlight = 8;
  for (int base = threadIdx.x; base < total; base += kInFlight * blockDim.x) {
    float v[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int e = base + u * blockDim.x;
      v[u] = e < total ? value(e) : 0.f;
    }
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int e = base + u * blockDim.x;
      if (e < total) store(e, v[u]);
    }
  }
}

// Stages `channels` planes [ih, iw] from `planes` into the zero-padded
// window s[channels][ph][pw] (consecutive threads read along a row).
template <typename T>
__device__ void stage_window(const T* planes, int channels, int ih, int iw, int pad_h, int pad_w, int ph, int pw,
                             float* s) {
  const int window = ph * pw;
  stage(
      channels * window,
      [=](int e) {
        const int c = e / window, r = e - c * window, py = r / pw, px = r - py * pw;
        const int iy = py - pad_h, ix = px - pad_w;
        return iy >= 0 && iy < ih && ix >= 0 && ix < iw ? to_float(planes[(c * ih + iy) * iw + ix]) : 0.f;
      },
      [=](int e, float v) { s[e] = v; });
}

// acc[g] += the window at xp times the filters at wp, over `channels`
// input channels (wp advances G per tap, xp one window per channel).
template <int G, int K>
__device__ __forceinline__ void accumulate(float (&acc)[G], const float* xp, const float* wp, int channels, int kh,
                                           int kw, int pw, int window) {
  if constexpr (K > 0) kh = kw = K;
  for (int c = 0; c < channels; ++c, xp += window) {
#pragma unroll
    for (int i = 0; i < (K > 0 ? K : kh); ++i)
#pragma unroll
      for (int j = 0; j < (K > 0 ? K : kw); ++j, wp += G) {
        const float xv = xp[i * pw + j];
        float wv[G];
        load_group<G>(wp, wv);
#pragma unroll
        for (int g = 0; g < G; ++g) acc[g] = fmaf(xv, wv[g], acc[g]);
      }
  }
}

// Block (b, image): output channel groups [b*groups_per_block, +groups_per_block)
// of one image, G channels each. Shared memory: those channels' filters as
// sw[group][k][G] (k = (c, i, j)), then the input window. Thread
// (group, t) computes pixels t, t + pixel_threads, ..., G channels at once.
// Input channels too many for shared memory go in chunks of ci_chunk
// (then each thread has one pixel, its sums held across the chunks).
// kFlip: backward data at stride 1, where `in` is dY, `w` the forward's
// filter [ci][co][kh][kw] and the filter used is its transpose, flipped.
// K > 0: a K x K filter known at compile time (the loops unroll).
template <int G, int K, bool kFlip, typename T>
__global__ void __launch_bounds__(kDirectThreads)
    direct_conv_kernel(DirectDims d, int pixel_threads, int groups_per_block, int ci_chunk, const T* in, const T* w,
                       const T* bias, bool relu, T* out) {
  extern __shared__ float4 direct_shared[];
  float* sw = reinterpret_cast<float*>(direct_shared);
  const int kh = K > 0 ? K : d.kh, kw = K > 0 ? K : d.kw, taps = kh * kw, depth = d.ci * taps;
  const int o_first = blockIdx.x * groups_per_block * G, image = blockIdx.y, per_group = ci_chunk * taps * G;
  float* sx = sw + per_group * groups_per_block;
  const int gl = threadIdx.x / pixel_threads, first_pixel = threadIdx.x - gl * pixel_threads;
  const int o0 = o_first + gl * G, pixels = d.oh * d.ow, window = d.ph * d.pw;
  const bool active = gl < groups_per_block && o0 < d.co;
  float acc[G];  // the bias starts the sum, as in ref::conv2d
#pragma unroll
  for (int g = 0; g < G; ++g) acc[g] = active && bias != nullptr && o0 + g < d.co ? to_float(bias[o0 + g]) : 0.f;
  auto stage_chunk = [&](int c0, int channels) {
    const int chunk_group = channels * taps * G;
    stage(
        chunk_group * groups_per_block,
        [=](int e) {
          const int g = e / chunk_group, r = e - g * chunk_group, kl = r / G, o = o_first + g * G + (r - kl * G);
          const int k = c0 * taps + kl;
          if (o >= d.co) return 0.f;
          if constexpr (kFlip) {
            const int c = k / taps, t = k - c * taps;
            return to_float(w[(c * d.co + o) * taps + flipped_tap(t, taps)]);
          } else {
            return to_float(w[o * depth + k]);
          }
        },
        [=](int e, float v) {
          const int g = e / chunk_group;
          sw[g * per_group + (e - g * chunk_group)] = v;
        });
    stage_window(in + (image * d.ci + c0) * (d.ih * d.iw), channels, d.ih, d.iw, d.pad_h, d.pad_w, d.ph, d.pw, sx);
  };
  T* y = out + (image * d.co + o0) * pixels;
  auto store = [&](int p) {
#pragma unroll
    for (int g = 0; g < G; ++g)
      if (o0 + g < d.co) y[g * pixels + p] = from_float<T>(relu && !(acc[g] > 0.f) ? 0.f : acc[g]);
  };
  if (ci_chunk < d.ci) {  // one pixel per thread (pixels <= pixel_threads)
    const bool valid = active && first_pixel < pixels;
    const int oy = first_pixel / d.ow, ox = first_pixel - oy * d.ow;
    for (int c0 = 0; c0 < d.ci; c0 += ci_chunk) {
      const int channels = min(ci_chunk, d.ci - c0);
      stage_chunk(c0, channels);
      __syncthreads();
      if (valid)
        accumulate<G, K>(acc, sx + oy * d.stride * d.pw + ox * d.stride, sw + gl * per_group, channels, kh, kw,
                         d.pw, window);
      __syncthreads();
    }
    if (valid) store(first_pixel);
    return;
  }
  stage_chunk(0, d.ci);
  __syncthreads();
  if (!active) return;
  float start[G];
#pragma unroll
  for (int g = 0; g < G; ++g) start[g] = acc[g];
  for (int p = first_pixel; p < pixels; p += pixel_threads) {
    const int oy = p / d.ow, ox = p - oy * d.ow;
#pragma unroll
    for (int g = 0; g < G; ++g) acc[g] = start[g];
    accumulate<G, K>(acc, sx + oy * d.stride * d.pw + ox * d.stride, sw + gl * per_group, d.ci, kh, kw, d.pw,
                     window);
    store(p);
  }
}

// Backward filter. Items are (channel group og, c, i, j), og major; block
// (chunk, image group, row split) owns items [chunk*per_chunk, +per_chunk)
// for the images of its group and the output rows oy = z*slices + slice +
// k*slices*row_splits, thread (slice, item) the rows of its slice. dY of
// one image is staged transposed for the block's channel groups only,
// sdy[pixel][staged channel] (G channels in one vector load), then the x
// window; the slices' sums are added in slice order and the block writes
// partials[image group][row split][o][c][i][j].
struct WgradDims {
  DirectDims d;  // ci = c, co = o, pad_h = pad_w = padding
  int items, per_chunk, slices, image_group, row_splits, staged;
};

template <int G, int K, typename T>
__global__ void __launch_bounds__(kDirectThreads)
    direct_wgrad_kernel(WgradDims wd, const T* dy, const T* x, float* partials) {
  extern __shared__ float4 direct_shared[];
  const DirectDims& d = wd.d;
  const int kh = K > 0 ? K : d.kh, kw = K > 0 ? K : d.kw, taps = kh * kw, ckk = d.ci * taps;
  const int pixels = d.oh * d.ow, window = d.ph * d.pw, staged = wd.staged;
  float* sdy = reinterpret_cast<float*>(direct_shared);
  float* sx = sdy + pixels * staged;
  float* sums = sx + d.ci * window;  // [slices][per_chunk][G]
  const int li = threadIdx.x % wd.per_chunk, slice = threadIdx.x / wd.per_chunk;
  const int item = blockIdx.x * wd.per_chunk + li;
  const int o_staged = (blockIdx.x * wd.per_chunk) / ckk * G;  // the first staged channel
  const bool active = slice < wd.slices && item < wd.items;
  const int og = active ? item / ckk : 0, cij = active ? item - og * ckk : 0;
  const int c = cij / taps, t = cij - c * taps, i = t / kw, j = t - i * kw;
  const float* xbase = sx + c * window + i * d.pw + j;
  const float* dybase = sdy + (active ? og * G - o_staged : 0);
  const int first_row = blockIdx.z * wd.slices + slice, row_step = wd.slices * wd.row_splits;
  float acc[G];
#pragma unroll
  for (int g = 0; g < G; ++g) acc[g] = 0.f;
  const int image_begin = blockIdx.y * wd.image_group;
  const int image_end = min(image_begin + wd.image_group, d.n);
  for (int image = image_begin; image < image_end; ++image) {
    const T* dyi = dy + image * d.co * pixels;
    stage(
        staged * pixels,
        [=](int e) {  // e = (channel, pixel): consecutive threads read consecutive pixels
          const int oc = e / pixels, p = e - oc * pixels, o = o_staged + oc;
          return o < d.co ? to_float(dyi[o * pixels + p]) : 0.f;
        },
        [=](int e, float v) {
          const int oc = e / pixels, p = e - oc * pixels;
          sdy[p * staged + oc] = v;
        });
    stage_window(x + image * (d.ci * d.ih * d.iw), d.ci, d.ih, d.iw, d.pad_h, d.pad_w, d.ph, d.pw, sx);
    __syncthreads();
    if (active)
      for (int oy = first_row; oy < d.oh; oy += row_step) {
        const float* xr = xbase + oy * d.stride * d.pw;
        const float* dr = dybase + oy * d.ow * staged;
        for (int ox = 0; ox < d.ow; ++ox) {
          const float xv = xr[ox * d.stride];
          float g[G];
          load_group<G>(dr + ox * staged, g);
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
  float* part = partials + (blockIdx.y * wd.row_splits + blockIdx.z) * (d.co * ckk);
#pragma unroll
  for (int q = 0; q < G; ++q) {
    float v = sums[li * G + q];
    for (int s = 1; s < wd.slices; ++s) v += sums[(s * wd.per_chunk + li) * G + q];
    if (og * G + q < d.co) part[(og * G + q) * ckk + cij] = v;
  }
}

// dw[e] = the sum of the `parts` partials of element e: one warp per
// element, lane l adding parts l, l + 32, ... in order, then a fixed
// shuffle tree (the same bits every run).
template <typename T>
__global__ void direct_wgrad_finish(const float* partials, int parts, int elements, T* dw) {
  const int lane = threadIdx.x % 32;
  for (int e = (blockIdx.x * blockDim.x + threadIdx.x) / 32; e < elements; e += gridDim.x * blockDim.x / 32) {
    float v = 0.f;
    for (int q = lane; q < parts; q += 32) v += partials[q * elements + e];
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (lane == 0) dw[e] = from_float<T>(v);
  }
}

bool fits_int(std::int64_t v) { return v < (std::int64_t(1) << 31); }

int round_warp(std::int64_t v) { return static_cast<int>((v + 31) / 32 * 32); }

// Channels per thread: the widest of 8, 4, 2 that pads `channels` by at
// most a quarter and still gives `units` x groups >= `wanted` (threads).
int pick_group(std::int64_t channels, std::int64_t units, std::int64_t wanted) {
  for (const int g : {8, 4, 2}) {
    const std::int64_t groups = (channels + g - 1) / g;
    if ((groups * g - channels) * 4 <= channels && units * groups >= wanted) return g;
  }
  return 2;
}

// The dims of the direct forward (or, flipped, backward data) kernel.
DirectDims direct_conv_dims(ConvPass pass, const ConvShape& s) {
  const int kh = int(s.kh), kw = int(s.kw);
  if (pass == ConvPass::forward) {
    const int oh = int(s.oh()), ow = int(s.ow()), st = int(s.stride);
    return {int(s.n), int(s.c), int(s.h), int(s.w), int(s.o), kh, kw, st, int(s.padding), int(s.padding), oh, ow,
            (oh - 1) * st + kh, (ow - 1) * st + kw};
  }
  // backward data at stride 1: correlate dY (padded by k - 1 - p) with the flipped filter.
  return {int(s.n), int(s.o), int(s.oh()), int(s.ow()), int(s.c), kh, kw, 1, transposed_padding(kh, int(s.padding)),
          transposed_padding(kw, int(s.padding)), int(s.h), int(s.w), int(s.h) - 1 + kh, int(s.w) - 1 + kw};
}

DirectDims direct_wgrad_dims(const ConvShape& s) {
  const int oh = int(s.oh()), ow = int(s.ow()), st = int(s.stride), kh = int(s.kh), kw = int(s.kw);
  return {int(s.n), int(s.c), int(s.h), int(s.w), int(s.o), kh, kw, st, int(s.padding), int(s.padding), oh, ow,
          (oh - 1) * st + kh, (ow - 1) * st + kw};
}

std::int64_t conv_shared_bytes(const DirectDims& d, int group, int groups_per_block, int ci_chunk) {
  return (std::int64_t(ci_chunk) * d.kh * d.kw * group * groups_per_block + std::int64_t(ci_chunk) * d.ph * d.pw) *
         std::int64_t(sizeof(float));
}

}  // namespace

bool plan(ImplicitGemmPlan& plan, int multiprocessors) {
  const ConvShape& s = plan.shape;
  if (s.n > 65535 || !fits_int(s.n * s.c * s.h * s.w) || !fits_int(s.n * s.o * s.oh() * s.ow()) ||
      !fits_int(s.o * s.c * s.kh * s.kw))
    return false;
  if (plan.pass != ConvPass::backward_filter) {
    if (plan.pass == ConvPass::backward_data && (s.stride != 1 || s.padding > s.kh - 1 || s.padding > s.kw - 1))
      return false;
    const DirectDims d = direct_conv_dims(plan.pass, s);
    const std::int64_t pixels = std::int64_t(d.oh) * d.ow;
    // Enough threads over the GPU: 2 blocks' worth of 256 per multiprocessor.
    plan.group = pick_group(d.co, d.n * pixels, 512 * std::int64_t(multiprocessors));
    // Too large for shared memory: input channels in chunks when each thread
    // can hold its one pixel's sums, else narrower channel groups.
    plan.ci_chunk = d.ci;
    if (pixels <= 256)
      while (plan.ci_chunk > 1 && conv_shared_bytes(d, plan.group, 1, plan.ci_chunk) > kDirectMaxShared)
        plan.ci_chunk = (plan.ci_chunk + 1) / 2;
    while (plan.group > 2 && conv_shared_bytes(d, plan.group, 1, plan.ci_chunk) > kDirectMaxShared) plan.group /= 2;
    if (conv_shared_bytes(d, plan.group, 1, plan.ci_chunk) > kDirectMaxShared) return false;
    const int groups = (d.co + plan.group - 1) / plan.group;
    plan.pixel_threads = round_warp(std::min<std::int64_t>(pixels, 256));
    // Channel groups share a block (the window staged once) up to 512 threads, spread evenly over the blocks.
    int per_block = std::max(1, std::min(groups, kDirectThreads / plan.pixel_threads));
    per_block = (groups + (groups + per_block - 1) / per_block - 1) / ((groups + per_block - 1) / per_block);
    while (per_block > 1 && conv_shared_bytes(d, plan.group, per_block, plan.ci_chunk) > kDirectMaxShared) --per_block;
    plan.groups_per_block = per_block;
    plan.threads = plan.pixel_threads * per_block;
    plan.shared_bytes = static_cast<int>(conv_shared_bytes(d, plan.group, per_block, plan.ci_chunk));
    plan.direct = true;
    return true;
  }
  const DirectDims d = direct_wgrad_dims(s);
  plan.group = pick_group(d.co, 1, 1);
  const std::int64_t ckk = std::int64_t(d.ci) * d.kh * d.kw;
  const std::int64_t groups = (d.co + plan.group - 1) / plan.group, items = groups * ckk;
  const std::int64_t pixels = std::int64_t(d.oh) * d.ow;
  // Items per block: whole channel groups when they are short (<= 256 items), else 256 items (two groups at most).
  std::int64_t per_chunk = 256, staged = 2 * plan.group;
  const std::int64_t window = std::int64_t(d.ci) * d.ph * d.pw;
  auto shared_bytes = [&](std::int64_t chunk, std::int64_t channels) {
    const std::int64_t slices = std::max<std::int64_t>(1, std::min<std::int64_t>(256 / chunk, d.oh));
    return (pixels * channels + window + slices * chunk * plan.group) * std::int64_t(sizeof(float));
  };
  if (ckk <= 256) {
    std::int64_t whole = std::min<std::int64_t>(groups, 256 / ckk);
    while (whole > 1 && shared_bytes(whole * ckk, whole * plan.group) > kDirectMaxShared) --whole;
    per_chunk = whole * ckk;
    staged = whole * plan.group;
  }
  plan.per_chunk = static_cast<int>(per_chunk);
  plan.staged_channels = static_cast<int>(staged);
  plan.item_chunks = static_cast<int>((items + per_chunk - 1) / per_chunk);
  plan.slices = static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(256 / per_chunk, d.oh)));
  plan.threads = round_warp(per_chunk * plan.slices);
  const std::int64_t base = std::int64_t(plan.item_chunks) * d.n;
  plan.image_group = static_cast<int>(std::max<std::int64_t>(1, base / (4 * std::int64_t(multiprocessors))));
  const std::int64_t image_groups = (d.n + plan.image_group - 1) / plan.image_group;
  const std::int64_t rows_per_split = std::max(1, d.oh / plan.slices);
  plan.row_splits = static_cast<int>(
      std::clamp<std::int64_t>((multiprocessors + base - 1) / base, 1, std::min<std::int64_t>(rows_per_split, 8)));
  const std::int64_t shared = shared_bytes(per_chunk, staged);
  if (shared > kDirectMaxShared || !fits_int(image_groups * plan.row_splits * d.co * ckk)) return false;
  plan.shared_bytes = static_cast<int>(shared);
  plan.direct = true;
  return true;
}

namespace {

// Lets `kernel` take more than 48 KiB of dynamic shared memory when it asks.
template <typename Kernel>
void allow_shared(Kernel kernel, int bytes) {
  if (bytes > 48 * 1024) SG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

template <int G, bool kFlip, typename T>
void run_direct_conv_g(const ImplicitGemmPlan& plan, const DirectDims& d, const T* in, const T* w, const T* bias,
                       bool relu, T* out, cudaStream_t stream) {
  const int groups = (d.co + G - 1) / G;
  const dim3 grid(static_cast<unsigned>((groups + plan.groups_per_block - 1) / plan.groups_per_block),
                  static_cast<unsigned>(d.n));
  const int pt = plan.pixel_threads, gb = plan.groups_per_block, cc = plan.ci_chunk;
  if (d.kh == 5 && d.kw == 5) {
    allow_shared(direct_conv_kernel<G, 5, kFlip, T>, plan.shared_bytes);
    direct_conv_kernel<G, 5, kFlip, T>
        <<<grid, plan.threads, plan.shared_bytes, stream>>>(d, pt, gb, cc, in, w, bias, relu, out);
  } else if (d.kh == 3 && d.kw == 3) {
    allow_shared(direct_conv_kernel<G, 3, kFlip, T>, plan.shared_bytes);
    direct_conv_kernel<G, 3, kFlip, T>
        <<<grid, plan.threads, plan.shared_bytes, stream>>>(d, pt, gb, cc, in, w, bias, relu, out);
  } else {
    allow_shared(direct_conv_kernel<G, 0, kFlip, T>, plan.shared_bytes);
    direct_conv_kernel<G, 0, kFlip, T>
        <<<grid, plan.threads, plan.shared_bytes, stream>>>(d, pt, gb, cc, in, w, bias, relu, out);
  }
  SG_LAUNCH_CHECK("direct_conv_kernel");
}

}  // namespace

template <bool kFlip, typename T>
void launch_conv(const ImplicitGemmPlan& plan, const T* in, const T* w, const T* bias, bool relu, T* out,
                 cudaStream_t stream) {
  const DirectDims d = direct_conv_dims(plan.pass, plan.shape);
  if (plan.group == 8) run_direct_conv_g<8, kFlip>(plan, d, in, w, bias, relu, out, stream);
  else if (plan.group == 4) run_direct_conv_g<4, kFlip>(plan, d, in, w, bias, relu, out, stream);
  else run_direct_conv_g<2, kFlip>(plan, d, in, w, bias, relu, out, stream);
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
void launch_wgrad(const ImplicitGemmPlan& plan, const T* dy, const T* x, T* dw, float* workspace, cudaStream_t stream) {
  if (!workspace) throw CudaError("direct conv weight gradient: needs its workspace");
  const ConvShape& s = plan.shape;
  const std::int64_t ckk = s.c * s.kh * s.kw;
  const std::int64_t items = (s.o + plan.group - 1) / plan.group * ckk;
  const WgradDims wd{direct_wgrad_dims(s), static_cast<int>(items), plan.per_chunk,    plan.slices,
                     plan.image_group,     plan.row_splits,         plan.staged_channels};
  if (plan.group == 8) run_direct_wgrad_g<8>(plan, wd, dy, x, workspace, stream);
  else if (plan.group == 4) run_direct_wgrad_g<4>(plan, wd, dy, x, workspace, stream);
  else run_direct_wgrad_g<2>(plan, wd, dy, x, workspace, stream);
  const int elements = static_cast<int>(s.o * ckk);
  direct_wgrad_finish<<<blocks_for(std::int64_t(elements) * 32), kThreads, 0, stream>>>(
      workspace, static_cast<int>(wgrad_parts(plan)), elements, dw);
  SG_LAUNCH_CHECK("direct_wgrad_finish");
}

#define SG_INSTANTIATE_DIRECT(T)                                                                                   \
  template void launch_conv<false, T>(const ImplicitGemmPlan&, const T*, const T*, const T*, bool, T*,             \
                                      cudaStream_t);                                                               \
  template void launch_conv<true, T>(const ImplicitGemmPlan&, const T*, const T*, const T*, bool, T*, cudaStream_t); \
  template void launch_wgrad<T>(const ImplicitGemmPlan&, const T*, const T*, T*, float*, cudaStream_t);
SG_INSTANTIATE_DIRECT(float)
SG_INSTANTIATE_DIRECT(__half)
SG_INSTANTIATE_DIRECT(__nv_bfloat16)
#undef SG_INSTANTIATE_DIRECT

}  // namespace sg::cuda::conv_direct
