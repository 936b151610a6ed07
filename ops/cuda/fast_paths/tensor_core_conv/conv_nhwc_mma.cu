// Channels-last convolutions on tensor cores (ops/cuda/fast_paths/tensor_core_conv/conv_nhwc_mma.hpp says
// what and why). One block computes a BM x BN tile of Y [pixels, channels]:
// its warps each hold a (BM / WARPS_M) x (BN / WARPS_N) tile of f32 sums in
// registers, fed by ldmatrix from a STAGES-deep ring of shared-memory K
// steps that cp.async fills while the tensor cores work on the older ones.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <stdexcept>
#include <type_traits>

#include "ops/cuda/conv_direct_common.cuh"
#include "ops/cuda/fast_paths/tensor_core_conv/conv_nhwc_common.cuh"
#include "ops/cuda/fast_paths/tensor_core_conv/conv_nhwc_halo.hpp"
#include "ops/cuda/fast_paths/tensor_core_conv/conv_nhwc_mma.hpp"
#include "ops/cuda/fast_paths/tensor_core_conv/conv_nhwc_resident.hpp"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/launch_config.cuh"
#include "ops/cuda/mma_fragments.cuh"

namespace sg::cuda {
namespace {

using nhwc_conv::copy16_or_zero;

constexpr int kStages = 4;  // K steps in the shared-memory ring

// The sizes a kernel reads, as ints (plan_nhwc_conv checks they fit).
struct Dims {
  int n, h, w, c, o, kh, kw, stride, padding, oh, ow, pixels;
};

// The filter [o,c,kh,kw] (or [o,kh,kw,c] when `krsc`) as B's rows,
// [cols][taps][k_channels]: forward, cols = o and k_channels = c; backward
// data, cols = c and k_channels = o with the taps reversed (the flipped filter).
template <typename T>
__global__ void rewrite_filter_kernel(const T* filter, T* out, int o, int c, int taps, bool backward_data, bool krsc) {
  const int total = o * c * taps;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const int k_channels = backward_data ? o : c;
    const int k = i % k_channels;
    const int t = (i / k_channels) % taps;
    const int col = i / (k_channels * taps);
    // The source element: filter output channel f, input channel ch, tap.
    const int f = backward_data ? k : col, ch = backward_data ? col : k, tap = backward_data ? taps - 1 - t : t;
    out[i] = krsc ? filter[(f * taps + tap) * c + ch] : filter[(f * c + ch) * taps + tap];
  }
}

template <int BM_, int BN_, int WARPS_M_, int WARPS_N_>
struct Tile {
  static constexpr int BM = BM_, BN = BN_, WARPS_M = WARPS_M_, WARPS_N = WARPS_N_;
  static constexpr int kThreads = 32 * WARPS_M * WARPS_N;
  static constexpr int kWarpRows = BM / WARPS_M, kWarpCols = BN / WARPS_N;
  static constexpr int kMTiles = kWarpRows / 16, kNTiles = kWarpCols / 8;
  static_assert(kWarpRows % 16 == 0 && kWarpCols % 16 == 0, "a warp holds whole 16 x 16 pieces");
};

// The tiles built (nhwc_conv_tile_count() entries; the index is the plan's `tile`).
using Tile0 = Tile<128, 32, 4, 1>;
using Tile1 = Tile<64, 32, 2, 1>;
using Tile2 = Tile<128, 64, 4, 2>;
using Tile3 = Tile<64, 64, 2, 2>;
using Tile4 = Tile<128, 128, 2, 4>;
using Tile5 = Tile<64, 128, 2, 4>;
using Tile6 = Tile<32, 32, 1, 1>;  // small grids: more blocks, one warp each
using Tile7 = Tile<32, 64, 1, 2>;
constexpr int kTileRows[] = {128, 64, 128, 64, 128, 64, 32, 32};
constexpr int kTileCols[] = {32, 32, 64, 64, 128, 128, 32, 64};
constexpr int kGemmTiles = 8;
constexpr int kHaloTiles = 3;  // + the halo form:
constexpr int kHaloCols[] = {32, 32, 64};  // its output channels a block
constexpr int kHaloPieces[] = {4, 2, 2};   // and 16-row pieces a warp (blocks of 256 or 128 pixels)
constexpr int kResidentCols[] = {32, 64};  // + the resident-filter form: its output channels a block
constexpr int kFirstResident = kGemmTiles + kHaloTiles;
constexpr int kTiles = kFirstResident + 2;

template <int BK>
__host__ __device__ constexpr int row_pitch() {
  return BK + 8;  // elements: 16 spare bytes per row spread ldmatrix's eight rows over all banks
}

template <typename TileT, int BK>
constexpr int shared_bytes() {
  return kStages * (TileT::BM + TileT::BN) * row_pitch<BK>() * 2;
}

template <typename T, typename TileT, int BK>
__global__ void __launch_bounds__(TileT::kThreads)
    conv_nhwc_mma_kernel(Dims d, const T* __restrict__ x, const T* __restrict__ b_rows, const T* __restrict__ bias,
                         bool relu, T* __restrict__ y) {
  constexpr int BM = TileT::BM, BN = TileT::BN, kThreads = TileT::kThreads, kPitch = row_pitch<BK>();
  constexpr int kChunks = BK / 8;  // 16-byte copies per row of a K step
  constexpr int kRowsPerPass = kThreads / kChunks;
  constexpr int kARows = (BM + kRowsPerPass - 1) / kRowsPerPass;
  constexpr int kBRows = (BN + kRowsPerPass - 1) / kRowsPerPass;
  static_assert(BM % kRowsPerPass == 0 || kRowsPerPass % BM == 0, "A rows split evenly over the threads");
  extern __shared__ __align__(16) unsigned char shared[];
  T* a_ring = reinterpret_cast<T*>(shared);
  T* b_ring = a_ring + kStages * BM * kPitch;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp / TileT::WARPS_N, warp_n = warp % TileT::WARPS_N;
  const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
  const int chunk = tid % kChunks, first_row = tid / kChunks;
  const int k_steps = d.kh * d.kw * (d.c / BK);

  // This thread's A rows, fixed over the K steps: the input's top-left corner of
  // the row's window and the element offset of that corner's channel chunk (may
  // lie in the padding: then only the bounds test below reads it).
  int a_top[kARows], a_left[kARows], a_offset[kARows];
#pragma unroll
  for (int i = 0; i < kARows; ++i) {
    const int m = m0 + first_row + i * kRowsPerPass;
    const int ow = m % d.ow, oh = (m / d.ow) % d.oh, img = m / (d.ow * d.oh);
    const bool inside = m < d.pixels;
    a_top[i] = inside ? oh * d.stride - d.padding : INT_MIN / 2;  // out-of-range rows read zeros
    a_left[i] = ow * d.stride - d.padding;
    a_offset[i] = inside ? ((img * d.h + a_top[i]) * d.w + a_left[i]) * d.c + chunk * 8 : 0;
  }
  // B rows are [col][taps * c]: K step s starts s * BK elements into each.
  const T* b_src = b_rows + static_cast<std::int64_t>(n0 + first_row) * d.kh * d.kw * d.c + chunk * 8;
  const int b_stride = kRowsPerPass * d.kh * d.kw * d.c;  // between this thread's B rows

  // Where the next K step to load sits: its tap (dh, dw) and channel offset.
  int load_dh = 0, load_dw = 0, load_c = 0, load_step_index = 0;
  const auto load_next = [&](int slot) {
    const int tap_offset = (load_dh * d.w + load_dw) * d.c + load_c;
    const std::uint32_t a_slot = shared_address(a_ring + slot * BM * kPitch + first_row * kPitch + chunk * 8);
#pragma unroll
    for (int i = 0; i < kARows; ++i) {
      if (kRowsPerPass > BM && first_row + i * kRowsPerPass >= BM) continue;
      const bool valid = static_cast<unsigned>(a_top[i] + load_dh) < static_cast<unsigned>(d.h) &&
                         static_cast<unsigned>(a_left[i] + load_dw) < static_cast<unsigned>(d.w);
      copy16_or_zero(a_slot + i * kRowsPerPass * kPitch * 2, valid ? x + (a_offset[i] + tap_offset) : x, valid);
    }
    const std::uint32_t b_slot = shared_address(b_ring + slot * BN * kPitch + first_row * kPitch + chunk * 8);
#pragma unroll
    for (int i = 0; i < kBRows; ++i) {
      const int row = first_row + i * kRowsPerPass;
      if (row < BN) {
        const bool valid = n0 + row < d.o;
        copy16_or_zero(b_slot + i * kRowsPerPass * kPitch * 2,
                       valid ? b_src + static_cast<std::int64_t>(i) * b_stride + load_step_index * BK : b_rows, valid);
      }
    }
    ++load_step_index;
    load_c += BK;
    if (load_c == d.c) {
      load_c = 0;
      if (++load_dw == d.kw) {
        load_dw = 0;
        ++load_dh;
      }
    }
  };

  float acc[TileT::kMTiles][TileT::kNTiles][4] = {};
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_steps) load_next(s);
    asm volatile("cp.async.commit_group;\n" ::);
  }
  for (int step = 0; step < k_steps; ++step) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 2) : "memory");
    __syncthreads();  // this step's tiles landed for all; the slot refilled below is free
    const int next = step + kStages - 1;
    if (next < k_steps) load_next(next % kStages);
    asm volatile("cp.async.commit_group;\n" ::);
    const T* a_slot = a_ring + (step % kStages) * BM * kPitch;
    const T* b_slot = b_ring + (step % kStages) * BN * kPitch;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      std::uint32_t a[TileT::kMTiles][4], b[TileT::kNTiles][2];
#pragma unroll
      for (int i = 0; i < TileT::kMTiles; ++i) {
        const int row = warp_m * TileT::kWarpRows + i * 16 + (lane & 15);
        load_matrices(a[i], shared_address(a_slot + row * kPitch + kk + (lane >> 4) * 8));
      }
#pragma unroll
      for (int j = 0; j < TileT::kNTiles; j += 2) {
        const int row = warp_n * TileT::kWarpCols + j * 8 + (lane & 7) + ((lane >> 4) << 3);
        std::uint32_t m[4];
        load_matrices(m, shared_address(b_slot + row * kPitch + kk + ((lane >> 3) & 1) * 8));
        b[j][0] = m[0];
        b[j][1] = m[1];
        b[j + 1][0] = m[2];
        b[j + 1][1] = m[3];
      }
#pragma unroll
      for (int i = 0; i < TileT::kMTiles; ++i)
#pragma unroll
        for (int j = 0; j < TileT::kNTiles; ++j) mma_16x8x16<T>(acc[i][j], a[i], b[j][0], b[j][1]);
    }
  }
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");

  // Epilogue: [+ bias] [relu], rounded once, two adjacent channels per store.
#pragma unroll
  for (int j = 0; j < TileT::kNTiles; ++j) {
    const int col = n0 + warp_n * TileT::kWarpCols + j * 8 + (lane & 3) * 2;
    if (col >= d.o) continue;
    const float b0 = bias ? to_float(bias[col]) : 0.f, b1 = bias ? to_float(bias[col + 1]) : 0.f;
#pragma unroll
    for (int i = 0; i < TileT::kMTiles; ++i)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = m0 + warp_m * TileT::kWarpRows + i * 16 + (lane >> 2) + half * 8;
        if (row >= d.pixels) continue;
        float v0 = acc[i][j][2 * half] + b0, v1 = acc[i][j][2 * half + 1] + b1;
        if (relu) {
          v0 = fmaxf(v0, 0.f);
          v1 = fmaxf(v1, 0.f);
        }
        *reinterpret_cast<std::uint32_t*>(y + static_cast<std::int64_t>(row) * d.o + col) = pack_floats<T>(v0, v1);
      }
  }
}

template <typename T, typename TileT, int BK>
void launch_tile(const Dims& d, const T* x, const T* b_rows, const T* bias, bool relu, T* y, cudaStream_t stream) {
  constexpr int bytes = shared_bytes<TileT, BK>();
  auto* kernel = conv_nhwc_mma_kernel<T, TileT, BK>;
  conv_direct::allow_shared(kernel, bytes);
  const dim3 grid(static_cast<unsigned>((d.pixels + TileT::BM - 1) / TileT::BM),
                  static_cast<unsigned>((d.o + TileT::BN - 1) / TileT::BN));
  kernel<<<grid, TileT::kThreads, bytes, stream>>>(d, x, b_rows, bias, relu, y);
  SG_LAUNCH_CHECK("conv_nhwc_mma_kernel");
}

template <typename T, int BK>
void launch_tiles(int tile, const Dims& d, const T* x, const T* b_rows, const T* bias, bool relu, T* y,
                  cudaStream_t s) {
  switch (tile) {
    case 0: return launch_tile<T, Tile0, BK>(d, x, b_rows, bias, relu, y, s);
    case 1: return launch_tile<T, Tile1, BK>(d, x, b_rows, bias, relu, y, s);
    case 2: return launch_tile<T, Tile2, BK>(d, x, b_rows, bias, relu, y, s);
    case 3: return launch_tile<T, Tile3, BK>(d, x, b_rows, bias, relu, y, s);
    case 4: return launch_tile<T, Tile4, BK>(d, x, b_rows, bias, relu, y, s);
    case 5: return launch_tile<T, Tile5, BK>(d, x, b_rows, bias, relu, y, s);
    case 6: return launch_tile<T, Tile6, BK>(d, x, b_rows, bias, relu, y, s);
    default: return launch_tile<T, Tile7, BK>(d, x, b_rows, bias, relu, y, s);
  }
}

bool fits_int(std::int64_t v) { return v >= 0 && v <= INT_MAX; }

}  // namespace

int nhwc_conv_tile_count() { return kTiles; }

std::string NhwcConvPlan::describe() const {
  const std::string what = pass == NhwcConvPass::backward_data ? " (backward data as a forward over dY)" : "";
  if (tile >= kFirstResident)
    return fmt::format("tensor-core NHWC conv{}, resident filter of {} channels, {} output rows a unit, {} blocks",
                       what, kResidentCols[tile - kFirstResident], halo_rows, resident_blocks);
  if (tile >= kGemmTiles)
    return fmt::format("tensor-core NHWC conv{}, halo of {} output rows x {} channels a block", what, halo_rows,
                       kHaloCols[tile - kGemmTiles]);
  return fmt::format("tensor-core NHWC conv{}, tile {}x{}, K step {}", what, kTileRows[tile], kTileCols[tile], k_step);
}

std::string nhwc_conv_why_not(NhwcConvPass pass, const NhwcConvShape& f) {
  const bool data = pass == NhwcConvPass::backward_data;
  const std::int64_t k_channels = data ? f.o : f.c, out_channels = data ? f.c : f.o;
  if (k_channels % 16 != 0)
    return fmt::format("{} channels are read: not a multiple of 16", k_channels);
  if (out_channels % 8 != 0) return fmt::format("{} channels are written: not a multiple of 8", out_channels);
  if (data && f.stride != 1) return fmt::format("stride {}: the backward data pass is built for stride 1", f.stride);
  if (data && f.padding > f.kh - 1) return fmt::format("padding {} wider than the kernel less one", f.padding);
  if (data && f.kh != f.kw) return "a non-square kernel's backward data pass";
  if (!fits_int(f.n * f.h * f.w * f.c) || !fits_int(f.n * f.oh() * f.ow() * f.o) || !fits_int(f.o * f.c * f.kh * f.kw))
    return "a tensor of more than 2^31 elements";
  if (f.oh() <= 0 || f.ow() <= 0) return "an empty output";
  return "";
}

NhwcConvPlan plan_nhwc_conv(NhwcConvPass pass, const NhwcConvShape& f, int tile, int sm_count) {
  const std::string why = nhwc_conv_why_not(pass, f);
  if (!why.empty()) throw std::invalid_argument("plan_nhwc_conv: " + why);
  NhwcConvPlan p;
  p.pass = pass;
  if (pass == NhwcConvPass::forward) {
    p.gemm = f;
  } else {  // dX = the forward over dY [n, oh, ow, o] with the flipped filter, padding kh-1-p
    p.gemm = {f.n, f.oh(), f.ow(), f.o, f.c, f.kh, f.kw, 1, f.kh - 1 - f.padding};
  }
  p.k_step = p.gemm.c % 32 == 0 ? 32 : 16;
  if (tile >= kTiles) throw std::invalid_argument("plan_nhwc_conv: no such tile");
  if (tile < 0) tile = p.gemm.o <= 32 ? kGemmTiles : kGemmTiles + 2;  // the halo form first
  if (tile >= kFirstResident) {
    const nhwc_conv::ResidentSplit split =
        nhwc_conv::resident_conv_runs_here()
            ? nhwc_conv::resident_split(p.gemm, kResidentCols[tile - kFirstResident], sm_count)
            : nhwc_conv::ResidentSplit{};
    if (split.tile_rows > 0) {
      p.tile = tile;
      p.halo_rows = split.tile_rows;
      p.resident_blocks = split.blocks;
      return p;
    }
    tile = -1;  // a GEMM tile, chosen below
  } else if (tile >= kGemmTiles) {
    const int bn = kHaloCols[tile - kGemmTiles];
    p.halo_rows = nhwc_conv::halo_tile_rows(p.gemm, bn, kHaloPieces[tile - kGemmTiles]);
    if (p.halo_rows > 0) {
      p.tile = tile;
      return p;
    }
    tile = -1;  // a GEMM tile, chosen below
  }
  if (tile >= 0) {
    p.tile = tile;
    return p;
  }
  // Without timing: the narrowest column tile that holds every output channel (up to 128), and
  // the most rows that still give every multiprocessor two blocks (32 rows at least).
  const std::int64_t pixels = p.gemm.n * p.gemm.oh() * p.gemm.ow();
  const int cols = p.gemm.o <= 32 ? 32 : p.gemm.o <= 64 ? 64 : 128;
  const std::int64_t column_tiles = (p.gemm.o + cols - 1) / cols;
  int rows = 128;
  while (rows > 32 && (pixels + rows - 1) / rows * column_tiles < 2 * sm_count) rows /= 2;
  if (cols == 128) rows = std::max(rows, 64);
  for (int t = 0; t < kGemmTiles; ++t)
    if (kTileCols[t] == cols && kTileRows[t] == rows) p.tile = t;
  return p;
}

template <typename T>
void launch_nhwc_conv(const NhwcConvPlan& p, const T* input, const T* filter, const T* bias, bool relu, T* output,
                      T* rewritten, cudaStream_t stream) {
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>, "tensor cores take f16 / bf16");
  const NhwcConvShape& g = p.gemm;
  const bool data = p.pass == NhwcConvPass::backward_data;
  // The parameter's [o, c] are the gemm's [c, o] in the backward data pass.
  const int fo = static_cast<int>(data ? g.c : g.o), fc = static_cast<int>(data ? g.o : g.c);
  const int taps = static_cast<int>(g.kh * g.kw);
  const int total = fo * fc * taps;
  if (data || !p.filter_krsc) {
    rewrite_filter_kernel<T><<<std::min((total + 255) / 256, 1024), 256, 0, stream>>>(filter, rewritten, fo, fc, taps,
                                                                                     data, p.filter_krsc);
    SG_LAUNCH_CHECK("rewrite_filter_kernel");
  } else {
    rewritten = const_cast<T*>(filter);  // [o][taps][c] already: what the kernels read
  }
  const Dims d{static_cast<int>(g.n),      static_cast<int>(g.h),        static_cast<int>(g.w),
               static_cast<int>(g.c),      static_cast<int>(g.o),        static_cast<int>(g.kh),
               static_cast<int>(g.kw),     static_cast<int>(g.stride),   static_cast<int>(g.padding),
               static_cast<int>(g.oh()),   static_cast<int>(g.ow()),     static_cast<int>(g.n * g.oh() * g.ow())};
  if (p.tile >= kFirstResident)
    nhwc_conv::launch_resident_conv(g, kResidentCols[p.tile - kFirstResident], {p.halo_rows, p.resident_blocks},
                                    input, rewritten, bias, relu, output, stream);
  else if (p.tile >= kGemmTiles)
    nhwc_conv::launch_halo_conv(g, kHaloCols[p.tile - kGemmTiles], kHaloPieces[p.tile - kGemmTiles], p.halo_rows,
                                input, rewritten, bias, relu, output, stream);
  else if (p.k_step == 32)
    launch_tiles<T, 32>(p.tile, d, input, rewritten, bias, relu, output, stream);
  else
    launch_tiles<T, 16>(p.tile, d, input, rewritten, bias, relu, output, stream);
}

template void launch_nhwc_conv<__half>(const NhwcConvPlan&, const __half*, const __half*, const __half*, bool,
                                       __half*, __half*, cudaStream_t);
template void launch_nhwc_conv<__nv_bfloat16>(const NhwcConvPlan&, const __nv_bfloat16*, const __nv_bfloat16*,
                                              const __nv_bfloat16*, bool, __nv_bfloat16*, __nv_bfloat16*,
                                              cudaStream_t);

}  // namespace sg::cuda
