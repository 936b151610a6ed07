// The direct weight gradient on tensor cores (f16 / bf16; conv_direct.hpp
// says when it runs): dW [O, C*KH*KW (+1)] = dY^T [O, pixels] x
// im2col(X) [pixels, C*KH*KW (+1)], the sum over pixels one mma.m16n8k16
// (f32 accumulate) per 16 pixels x 16 channels x 8 columns. Nothing is
// converted: the products of 16-bit values are exact in f32, as in the
// SIMT kernel (conv_direct_wgrad.cu), whose ordered-partials scheme and
// finishing kernel this shares. Block (image group, pixel range, column
// block) stages a round of images: their dY for its pixels as a plain copy
// of dY's contiguous axis ([pixel][channel] channels-last, A by
// ldmatrix.trans; [channel][pixel] NCHW, A by ldmatrix) and their
// zero-padded window planes, beside a plane of ones (the bias column) and
// one of zeros (padding columns); B is gathered from the planes through a
// table of each pixel's window offset. Each warp owns a group of (channel,
// column) tiles and every k_splits-th chunk of 16 pixels; the splits' sums
// meet in shared memory in a fixed order, and the block writes its part
// of one partial of dW (and db). One wave of blocks, each as large as the
// partials' bytes allow (docs/benchmarks.md: blocks of a few hundred
// pixels are bound by their fixed costs, not by the tensor cores).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "ops/cuda/conv_direct.hpp"
#include "ops/cuda/conv_direct_common.cuh"
#include "ops/cuda/mma_fragments.cuh"

namespace sg::cuda::conv_direct {
namespace {

constexpr int kMmaThreads = 256;
constexpr int kMmaWarps = kMmaThreads / 32;
// A warp's tile group: up to 2 x 4 mma tiles (d.mw x d.nw), up to 32 channels x 32 columns (32 floats a lane).
constexpr int kWarpTilesM = 2, kWarpTilesN = 4;
// Bytes of dY and X a block stages per round: enough in flight to cover a
// load's latency, little enough for kBlocksPerMultiprocessor blocks.
constexpr int kRoundBytes = 32 * 1024;
// Blocks a multiprocessor holds (registers: __launch_bounds__), and the most
// bytes of partials the blocks leave.
constexpr int kBlocksPerMultiprocessor = 3;
constexpr std::int64_t kPartialBytes = 2 << 20;

struct MmaWgradDims {
  int n, c, h, w, o, kh, kw, stride, pad, oh, ow, ph, pw;
  int taps, cols;        // c*kh*kw, and + 1 with the bias gradient
  int mt, nt;            // tiles: ceil(o / 16) of channels, ceil(cols / 8) of columns
  int mw, nw;            // a tile group's tiles (ImplicitGemmPlan::TensorCoreWgrad)
  int n_groups;          // ceil(nt / nw): tile group g is (m group g / n_groups, n group g % n_groups)
  int tile_groups;       // all of them; blockIdx.z takes [z * groups_per_block, +groups_per_block)
  int groups_per_block;  // <= kMmaWarps
  int k_splits;          // warps per tile group, each taking every k_splits-th chunk of 16 pixels
  int range_pixels;      // output pixels per block (blockIdx.y: which range), a multiple of 16
  int image_group;       // images per block (blockIdx.x: which group)
  int images_at_once;    // images staged per round
  int row_stride;        // 16-bit elements between staged rows (pixels channels-last, channels NCHW)
  bool dy_last, bias;
  bool dy_vectors;  // dY read 16 bytes at a time (set at launch: sizes and alignment allow it)
};

__host__ __device__ inline int round16(int v) { return (v + 15) / 16 * 16; }

// Floats of one tile group's sums: mw * 16 channels x nw * 8 columns.
__host__ __device__ inline int group_elements(const MmaWgradDims& d) { return d.mw * d.nw * 128; }

// Shared memory: the window-offset table, the window planes (ones, zeros,
// then images_at_once x c planes), then dY's staging, which the warps' sums
// reuse at the end.
struct MmaShared {
  int table_bytes, planes_bytes, staging_bytes, sums_bytes;
  __host__ __device__ int total() const {
    return table_bytes + planes_bytes + (staging_bytes > sums_bytes ? staging_bytes : sums_bytes);
  }
};

__host__ __device__ inline int staged_rows_stride(const MmaWgradDims& d) {
  // An odd number of 16 bytes: ldmatrix's 8 rows fall in distinct banks.
  return d.dy_last ? d.mt * 16 + 8 : d.images_at_once * d.range_pixels + 8;
}

__host__ __device__ inline MmaShared mma_shared(const MmaWgradDims& d) {
  const int planes = (2 + d.images_at_once * d.c) * d.ph * d.pw * 2;
  const int staging = (d.dy_last ? d.images_at_once * d.range_pixels : d.mt * 16) * staged_rows_stride(d) * 2;
  return {d.range_pixels * 4, (planes + 15) / 16 * 16, staging,
          d.k_splits * d.groups_per_block * group_elements(d) * 4};
}

__device__ __forceinline__ std::uint32_t pack_pair(std::uint16_t lo, std::uint16_t hi) {
  return std::uint32_t(lo) | (std::uint32_t(hi) << 16);
}

// dY of `count` images from `first` for the block's pixels: row (image j,
// local pixel lp) is j * rows + lp, channels [o, mt*16) and pixels past
// the range zero (they add nothing). Channels-last: sdy[row][channel];
// NCHW: sdy[channel][row] (each a plain copy of dY's contiguous axis).
template <bool kLast, typename T>
__device__ void stage_dy(const T* dy, const MmaWgradDims& d, int first, int count, int p_first, int p_count, int rows,
                         T* sdy) {
  const int pixels = d.oh * d.ow, width = d.mt * 16, stride = d.row_stride;
  if (d.dy_vectors) {
    // 8 channels (channels-last) or 8 pixels (NCHW) per 16-byte load.
    const int runs = kLast ? width / 8 : rows / 8;
    const int total = kLast ? count * rows * runs : width * count * runs;
    constexpr int kInFlight = 4;
    for (int base = threadIdx.x; base < total; base += kInFlight * blockDim.x) {
      uint4 v[kInFlight];
      int at[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int e = base + u * blockDim.x;
        v[u] = make_uint4(0, 0, 0, 0);
        at[u] = -1;
        if (e >= total) continue;
        if constexpr (kLast) {
          const int row = e / runs, ch = (e - row * runs) * 8, j = row / rows, lp = row - j * rows;
          if (lp < p_count && ch < d.o)
            v[u] = *reinterpret_cast<const uint4*>(dy + (std::int64_t(first + j) * pixels + p_first + lp) * d.o + ch);
          at[u] = row * stride + ch;
        } else {
          // p_count is a multiple of 8 here (pixels and p_first are).
          const int line = e / runs, lp = (e - line * runs) * 8, ch = line / count, j = line - ch * count;
          if (lp < p_count && ch < d.o)
            v[u] = *reinterpret_cast<const uint4*>(dy + (std::int64_t(first + j) * d.o + ch) * pixels + p_first + lp);
          at[u] = ch * stride + j * rows + lp;
        }
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u)
        if (at[u] >= 0) *reinterpret_cast<uint4*>(sdy + at[u]) = v[u];
    }
    return;
  }
  // One element at a time, consecutive threads along dY's contiguous axis.
  if constexpr (kLast)
    stage(
        count * rows * width,
        [=](int e) {
          const int row = e / width, ch = e - row * width, j = row / rows, lp = row - j * rows;
          return lp < p_count && ch < d.o ? to_float(dy[(std::int64_t(first + j) * pixels + p_first + lp) * d.o + ch])
                                          : 0.f;
        },
        [=](int e, float v) { sdy[(e / width) * stride + e % width] = from_float<T>(v); });
  else
    stage(
        width * count * rows,
        [=](int e) {
          const int line = e / rows, lp = e - line * rows, ch = line / count, j = line - ch * count;
          return lp < p_count && ch < d.o ? to_float(dy[(std::int64_t(first + j) * d.o + ch) * pixels + p_first + lp])
                                          : 0.f;
        },
        [=](int e, float v) {
          const int line = e / rows, lp = e - line * rows, ch = line / count, j = line - ch * count;
          sdy[ch * stride + j * rows + lp] = from_float<T>(v);
        });
}

template <bool kLast, typename T>
__global__ void __launch_bounds__(kMmaThreads, kBlocksPerMultiprocessor)
    mma_wgrad_kernel(MmaWgradDims d, const T* dy, const T* x, float* partials) {
  extern __shared__ float4 mma_shared_memory[];
  const MmaShared layout = mma_shared(d);
  char* base = reinterpret_cast<char*>(mma_shared_memory);
  int* offsets = reinterpret_cast<int*>(base);
  T* sx = reinterpret_cast<T*>(base + layout.table_bytes);
  T* sdy = reinterpret_cast<T*>(base + layout.table_bytes + layout.planes_bytes);
  float* sums = reinterpret_cast<float*>(sdy);  // after the last round
  const int window = d.ph * d.pw, pixels = d.oh * d.ow, image_planes = d.c * window;
  const int p_first = blockIdx.y * d.range_pixels, p_count = min(d.range_pixels, pixels - p_first);
  const int rows = round16(p_count), chunks_per_image = rows / 16;
  // Each local pixel's window offset (0 past the range: its dY is zero).
  for (int lp = threadIdx.x; lp < d.range_pixels; lp += blockDim.x) {
    const int p = p_first + lp, oy = p / d.ow, ox = p - oy * d.ow;
    offsets[lp] = lp < p_count ? oy * d.stride * d.pw + ox * d.stride : 0;
  }
  for (int e = threadIdx.x; e < 2 * window; e += blockDim.x) sx[e] = from_float<T>(e < window ? 1.f : 0.f);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int group_first = blockIdx.z * d.groups_per_block;
  const int groups_here = min(d.groups_per_block, d.tile_groups - group_first);
  const int local = warp / d.k_splits, ks = warp - local * d.k_splits;
  const bool active = local < groups_here;
  const int tg = group_first + (active ? local : 0);
  const int m0 = (tg / d.n_groups) * d.mw, n0 = (tg % d.n_groups) * d.nw, ge = group_elements(d), width = d.nw * 8;
  // Column n = (n0 + j) * 8 + g of this lane's B fragments: its tap's place
  // in image 0's planes (`data`: an image's planes are image_planes apart),
  // or the ones plane (the bias) or the zeros plane (past the columns).
  int tap_at[kWarpTilesN];
  bool data[kWarpTilesN];
#pragma unroll
  for (int j = 0; j < kWarpTilesN; ++j) {
    const int col = (n0 + j) * 8 + g, kk = d.kh * d.kw;
    const int c = col / kk, r = col - c * kk, i = r / d.kw, jj = r - i * d.kw;
    data[j] = col < d.taps;
    tap_at[j] = data[j] ? (2 + c) * window + i * d.pw + jj : (col == d.taps && d.bias ? 0 : window);
  }
  // ldmatrix's row for this lane: matrix lane / 8 is (+8 channels if odd, +8 pixels if >= 2).
  const int a_pixel = ((lane / 8) >> 1) * 8, a_channel = ((lane / 8) & 1) * 8, a_row = lane % 8;
  float acc[kWarpTilesM][kWarpTilesN][4] = {};
  const int image_begin = blockIdx.x * d.image_group, image_end = min(image_begin + d.image_group, d.n);
  for (int first = image_begin; first < image_end; first += d.images_at_once) {
    const int count = min(d.images_at_once, image_end - first);
    stage_dy<kLast>(dy, d, first, count, p_first, p_count, rows, sdy);
    const T* xi = x + std::int64_t(first) * d.c * d.h * d.w;  // the round's planes, one after another
    stage(
        count * image_planes,
        [=](int e) {
          const int c = e / window, r = e - c * window, py = r / d.pw, px = r - py * d.pw;
          const int iy = py - d.pad, ix = px - d.pad;
          return iy >= 0 && iy < d.h && ix >= 0 && ix < d.w ? to_float(xi[(c * d.h + iy) * d.w + ix]) : 0.f;
        },
        [=](int e, float v) { sx[2 * window + e] = from_float<T>(v); });
    __syncthreads();
    if (active)
      for (int kc = ks; kc < count * chunks_per_image; kc += d.k_splits) {
        const int j = kc / chunks_per_image, lp0 = (kc - j * chunks_per_image) * 16;
        std::uint32_t a[kWarpTilesM][4];
#pragma unroll
        for (int mi = 0; mi < kWarpTilesM; ++mi) {
          if (mi >= d.mw || m0 + mi >= d.mt) continue;
          const int channel = (m0 + mi) * 16 + a_channel;
          if constexpr (kLast)
            load_matrices_transposed(a[mi], shared_address(sdy + (kc * 16 + a_pixel + a_row) * d.row_stride + channel));
          else
            load_matrices(a[mi], shared_address(sdy + (channel + a_row) * d.row_stride + kc * 16 + a_pixel));
        }
        const int* pk = offsets + lp0 + 2 * t;
        const int p0 = pk[0], p1 = pk[1], p8 = pk[8], p9 = pk[9];
        const auto* xs = reinterpret_cast<const std::uint16_t*>(sx);
        const int image_at = j * image_planes;
#pragma unroll
        for (int jn = 0; jn < kWarpTilesN; ++jn) {
          if (jn >= d.nw || n0 + jn >= d.nt) continue;
          const std::uint16_t* col = xs + tap_at[jn] + (data[jn] ? image_at : 0);
          const std::uint32_t b0 = pack_pair(col[p0], col[p1]), b1 = pack_pair(col[p8], col[p9]);
#pragma unroll
          for (int mi = 0; mi < kWarpTilesM; ++mi)
            if (mi < d.mw && m0 + mi < d.mt) mma_16x8x16<T>(acc[mi][jn], a[mi], b0, b1);
        }
      }
    __syncthreads();
  }
  // The warps' sums, [k split][local group][mw * 16][nw * 8], added in split order.
  if (active)
#pragma unroll
    for (int mi = 0; mi < kWarpTilesM; ++mi)
#pragma unroll
      for (int jn = 0; jn < kWarpTilesN; ++jn) {
        if (mi >= d.mw || jn >= d.nw) continue;
        float* s = sums + (ks * d.groups_per_block + local) * ge + (mi * 16 + g) * width + jn * 8 + 2 * t;
        s[0] = acc[mi][jn][0];
        s[1] = acc[mi][jn][1];
        s[8 * width] = acc[mi][jn][2];
        s[8 * width + 1] = acc[mi][jn][3];
      }
  __syncthreads();
  float* part = partials + (std::int64_t(blockIdx.x) * gridDim.y + blockIdx.y) * (d.o * d.cols);
  for (int e = threadIdx.x; e < groups_here * ge; e += blockDim.x) {
    const int lg = e / ge, r = (e - lg * ge) / width, cc = e % width, group = group_first + lg;
    const int row = (group / d.n_groups) * d.mw * 16 + r, col = (group % d.n_groups) * width + cc;
    if (row >= d.o || col >= d.cols) continue;
    float v = 0.f;
    for (int s = 0; s < d.k_splits; ++s) v += sums[(s * d.groups_per_block + lg) * ge + r * width + cc];
    part[row * d.cols + col] = v;
  }
}

MmaWgradDims mma_dims(const ImplicitGemmPlan& plan) {
  const ConvShape& s = plan.shape;
  MmaWgradDims d{};
  d.n = int(s.n), d.c = int(s.c), d.h = int(s.h), d.w = int(s.w), d.o = int(s.o), d.kh = int(s.kh), d.kw = int(s.kw);
  d.stride = int(s.stride), d.pad = int(s.padding), d.oh = int(s.oh()), d.ow = int(s.ow());
  d.ph = (d.oh - 1) * d.stride + d.kh, d.pw = (d.ow - 1) * d.stride + d.kw;
  d.taps = d.c * d.kh * d.kw, d.bias = plan.bias_gradient, d.cols = d.taps + (d.bias ? 1 : 0);
  d.mt = (d.o + 15) / 16, d.nt = (d.cols + 7) / 8, d.mw = plan.mma.tiles_m, d.nw = plan.mma.tiles_n;
  d.n_groups = (d.nt + d.nw - 1) / d.nw, d.tile_groups = (d.mt + d.mw - 1) / d.mw * d.n_groups;
  d.dy_last = s.dy_channels_last;
  const ImplicitGemmPlan::TensorCoreWgrad& m = plan.mma;
  d.groups_per_block = m.groups_per_block, d.k_splits = std::max(1, kMmaWarps / m.groups_per_block);
  d.range_pixels = m.range_pixels, d.image_group = m.image_group, d.images_at_once = m.images_at_once;
  d.row_stride = staged_rows_stride(d);
  return d;
}

}  // namespace

bool plan_wgrad_mma(ImplicitGemmPlan& plan, int multiprocessors) {
  plan.mma = {};
  ImplicitGemmPlan::TensorCoreWgrad& m = plan.mma;
  // A warp's tiles: the most (A and B fragments reused across them) that
  // still give every warp a group of its own, or one tile each when the
  // tiles are fewer than the warps (the rest split the pixels: their sums
  // meet in shared memory).
  const std::int64_t mt = (plan.shape.o + 15) / 16,
                     nt = (plan.shape.c * plan.shape.kh * plan.shape.kw + (plan.bias_gradient ? 1 : 0) + 7) / 8;
  for (const auto& [tm, tn] : {std::pair{2, 4}, std::pair{1, 4}, std::pair{1, 2}, std::pair{1, 1}}) {
    m.tiles_m = tm, m.tiles_n = tn;
    if ((mt + tm - 1) / tm * ((nt + tn - 1) / tn) >= kMmaWarps) break;
  }
  MmaWgradDims d = mma_dims(plan);
  // At most kMmaWarps blocks over the (channel, column) tile groups.
  if (d.tile_groups > kMmaWarps * kMmaWarps) return false;
  // One wave of blocks (kBlocksPerMultiprocessor each): pixel ranges when
  // the images are fewer than the slots, image groups when more; the
  // (channel, column) tile groups over more blocks where slots are left.
  // Each block over image groups x ranges leaves one partial of dW (o x cols
  // floats) that the finishing kernel reads back: at most kPartialBytes.
  const std::int64_t pixels = std::int64_t(d.oh) * d.ow, chunks = (pixels + 15) / 16;
  const std::int64_t slots = std::int64_t(kBlocksPerMultiprocessor) * multiprocessors;
  const std::int64_t most_parts = std::max<std::int64_t>(1, kPartialBytes / (4 * std::int64_t(d.o) * d.cols));
  std::int64_t ranges = std::clamp<std::int64_t>(std::min(slots, most_parts) / d.n, 1, chunks);
  m.groups_per_block = std::min(d.tile_groups, kMmaWarps);
  m.images_at_once = 1;
  for (;; ++ranges) {
    if (ranges > chunks) return false;
    m.range_pixels = static_cast<int>((chunks + ranges - 1) / ranges * 16);
    d = mma_dims(plan);
    if (mma_shared(d).total() <= kDirectMaxShared) break;
  }
  ranges = (pixels + m.range_pixels - 1) / m.range_pixels;
  m.ranges = static_cast<int>(ranges);
  const std::int64_t image_groups = std::clamp<std::int64_t>(std::min(slots, most_parts) / ranges, 1, d.n);
  m.image_group = static_cast<int>((d.n + image_groups - 1) / image_groups);
  const std::int64_t parts = (d.n + m.image_group - 1) / m.image_group * ranges;
  const std::int64_t spread = std::clamp<std::int64_t>(slots / parts, 1, d.tile_groups);
  m.groups_per_block = static_cast<int>(std::min<std::int64_t>((d.tile_groups + spread - 1) / spread, kMmaWarps));
  m.column_blocks = (d.tile_groups + m.groups_per_block - 1) / m.groups_per_block;
  // Images per round: up to kRoundBytes of dY and X staged at once.
  const std::int64_t per_image = std::int64_t(m.range_pixels) * d.mt * 16 * 2 + std::int64_t(d.c) * d.ph * d.pw * 2;
  m.images_at_once = static_cast<int>(std::clamp<std::int64_t>(kRoundBytes / per_image, 1, m.image_group));
  for (;; --m.images_at_once) {
    d = mma_dims(plan);
    if (mma_shared(d).total() <= kDirectMaxShared) break;
    if (m.images_at_once == 1) return false;
  }
  if (!fits_int(parts * d.o * d.cols) || !fits_int(std::int64_t(d.n) * d.o * pixels)) return false;
  m.shared_bytes = mma_shared(d).total();
  m.usable = true;
  return true;
}

std::int64_t mma_wgrad_parts(const ImplicitGemmPlan& plan) {
  if (!plan.mma.usable) return 0;
  return (plan.shape.n + plan.mma.image_group - 1) / plan.mma.image_group * plan.mma.ranges;
}

template <typename T>
void launch_wgrad_mma(const ImplicitGemmPlan& plan, const T* dy, const T* x, float* partials, cudaStream_t stream) {
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>, "tensor cores take f16 / bf16");
  MmaWgradDims d = mma_dims(plan);
  const bool aligned = reinterpret_cast<std::uintptr_t>(dy) % 16 == 0;
  d.dy_vectors = aligned && (d.dy_last ? d.o % 8 == 0 : (d.oh * d.ow) % 8 == 0);
  const dim3 grid(static_cast<unsigned>((d.n + d.image_group - 1) / d.image_group),
                  static_cast<unsigned>(plan.mma.ranges), static_cast<unsigned>(plan.mma.column_blocks));
  if (d.dy_last) {
    allow_shared(mma_wgrad_kernel<true, T>, plan.mma.shared_bytes);
    mma_wgrad_kernel<true, T><<<grid, kMmaThreads, plan.mma.shared_bytes, stream>>>(d, dy, x, partials);
  } else {
    allow_shared(mma_wgrad_kernel<false, T>, plan.mma.shared_bytes);
    mma_wgrad_kernel<false, T><<<grid, kMmaThreads, plan.mma.shared_bytes, stream>>>(d, dy, x, partials);
  }
  SG_LAUNCH_CHECK("mma_wgrad_kernel");
}

template void launch_wgrad_mma<__half>(const ImplicitGemmPlan&, const __half*, const __half*, float*, cudaStream_t);
template void launch_wgrad_mma<__nv_bfloat16>(const ImplicitGemmPlan&, const __nv_bfloat16*, const __nv_bfloat16*,
                                              float*, cudaStream_t);

}  // namespace sg::cuda::conv_direct
