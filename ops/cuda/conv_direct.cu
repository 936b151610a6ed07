// The direct convolution kernels (conv_direct.hpp; when they run:
// conv_implicit_gemm.hpp). Forward and backward data: a block stages one
// image's zero-padded input planes and its channel groups' filters in shared
// memory as f32 and each thread computes G output channels of its pixels in
// registers. The weight gradient is in conv_direct_wgrad.cu.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "ops/cuda/conv_direct.hpp"
#include "ops/cuda/conv_direct_common.cuh"

namespace sg::cuda::conv_direct {
namespace {

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
  if (plan.pass == ConvPass::backward_filter) return plan_wgrad(plan, multiprocessors);
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

namespace {

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

#define SG_INSTANTIATE_DIRECT(T)                                                                                   \
  template void launch_conv<false, T>(const ImplicitGemmPlan&, const T*, const T*, const T*, bool, T*,             \
                                      cudaStream_t);                                                               \
  template void launch_conv<true, T>(const ImplicitGemmPlan&, const T*, const T*, const T*, bool, T*, cudaStream_t);
SG_INSTANTIATE_DIRECT(float)
SG_INSTANTIATE_DIRECT(__half)
SG_INSTANTIATE_DIRECT(__nv_bfloat16)
#undef SG_INSTANTIATE_DIRECT

}  // namespace sg::cuda::conv_direct
