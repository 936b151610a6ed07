// The resident-filter form of the channels-last tensor-core convolution
// (ops/cuda/fast_paths/tensor_core_conv/conv_nhwc_mma.hpp). The halo form
// (conv_nhwc_halo.cu) copies a block's filter rows and input window, waits
// for both, multiplies with four warps and exits. Here a block of eight warps
// keeps its BN filter rows in shared memory for the whole launch and walks
// units (some output rows of one image) in turn:
// - the filter comes in by bulk copies, one mbarrier a row of taps, so the
//   first unit's products start once the first row of taps and its halo
//   landed; the two blocks of a cluster each copy half the rows into both
//   (every block reads the same filter; timed per layer, the copies cost
//   about as much as the products, and sharing them was faster on every
//   layer);
// - the next unit's halo is copied into the second buffer while this one's
//   products run; halo rows are ow + 8k pixels apart, so an ldmatrix's eight
//   pixels that cross an output row still fall in eight bank groups;
// - each warp loads the fragments of K step s + 1 before the products of
//   step s, and for 32 or 64 channels and 3x3 or 5x5 taps the K walk of a
//   row of taps is unrolled with every offset an immediate (the runtime
//   loop's address arithmetic stalled the two warps a scheduler has).
// The K walk is the halo form's (tap by tap, 16 channels a step; a tap is the
// same halo read at shifted pixel addresses), so every output element is one
// thread's sum in the same fixed order: the same bits on every run.
// Built for sm_90a only (ops/cuda/CMakeLists.txt): plan_nhwc_conv plans it
// only where resident_conv_runs_here().
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "ops/cuda/async_copy.cuh"
#include "ops/cuda/conv_direct_common.cuh"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/dependent_launch.cuh"
#include "ops/cuda/fast_paths/tensor_core_conv/conv_nhwc_common.cuh"
#include "ops/cuda/fast_paths/tensor_core_conv/conv_nhwc_resident.hpp"
#include "ops/cuda/launch_config.cuh"
#include "ops/cuda/mma_fragments.cuh"
#include "ops/cuda/tma.cuh"

namespace sg::cuda::nhwc_conv {
namespace {

constexpr int kThreads = 256;        // eight warps
constexpr int kMaxUnitPixels = 256;  // sixteen 16-row pieces a unit
constexpr int kBarrierBytes = 128;   // the filter's mbarriers (one a tap row, 16 at most) before the filter rows
constexpr int kMaxTapRows = kBarrierBytes / 8;

struct ResidentDims {
  int n, h, w, c, o, kh, kw, stride, padding, oh, ow;
  int tile_rows, row_tiles, units, halo_rows, halo_cols;
  int halo_pitch;  // pixels a halo row takes in shared memory (halo_cols or more)
};

__device__ __forceinline__ void commit_async_group() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most one of this thread's cp.async groups (the newest) is in flight.
__device__ __forceinline__ void wait_all_but_newest_group() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

// The input window of unit `unit` (every channel of its halo rows and padded columns, zeros
// outside the image) into `halo`: pixel pitch c + 8, row pitch d.halo_pitch pixels.
template <typename T>
__device__ void copy_halo(const ResidentDims& d, int unit, const T* __restrict__ x, T* halo) {
  const int img = unit / d.row_tiles, top = (unit % d.row_tiles) * d.tile_rows * d.stride - d.padding;
  const int per_pixel = d.c / 8, pitch = d.c + 8, total = d.halo_rows * d.halo_cols * per_pixel;
  for (int i = threadIdx.x; i < total; i += kThreads) {
    const int pixel = i / per_pixel, chunk = i - pixel * per_pixel;
    const int hr = pixel / d.halo_cols, hc = pixel - hr * d.halo_cols;
    const int ih = top + hr, iw = hc - d.padding;
    const bool valid = static_cast<unsigned>(ih) < static_cast<unsigned>(d.h) &&
                       static_cast<unsigned>(iw) < static_cast<unsigned>(d.w);
    const T* src = valid ? x + (static_cast<std::int64_t>((img * d.h + ih) * d.w + iw) * d.c + chunk * 8) : x;
    copy16_or_zero(shared_address(halo + (hr * d.halo_pitch + hc) * pitch + chunk * 8), src, valid);
  }
}

// Byte offset in the halo of K step s of a row of taps (CS channel steps a tap) from the row's
// start: a tap is the next pixel, c + 8 values on. (In the filter rows a step is 32 bytes.)
template <int CS>
__host__ __device__ constexpr std::uint32_t a_step_offset(int s) {
  return (s / CS) * (CS * 16 + 8) * 2 + (s % CS) * 32;
}

template <typename T, int BN, int CS, int KW, int MC>
__global__ void __launch_bounds__(kThreads, 1)
    conv_nhwc_resident_kernel(ResidentDims d, const T* __restrict__ x, const T* __restrict__ b_rows,
                              const T* __restrict__ bias, bool relu, T* __restrict__ y) {
  // Warps: kWarpsN along the block's columns (32 each: four 8-column tiles), kWarpsM along its
  // 16-row pieces; warp row r takes pieces r, r + kWarpsM, ... (kMT of them at most).
  constexpr int kWarpsN = BN / 32, kWarpsM = 8 / kWarpsN, kMT = kMaxUnitPixels / 16 / kWarpsM, kNT = 4;
  static_assert(BN == 32 || BN == 64, "32 or 64 output channels a block");
  extern __shared__ __align__(128) unsigned char shared[];
  // CS, KW > 0: the channel steps a tap and the taps a row are compile-time (every offset of the
  // K walk an immediate); 0: read from d.
  const int c = CS > 0 ? CS * 16 : d.c, kw = KW > 0 ? KW : d.kw;
  const int pitch_a = c + 8, k_total = d.kh * kw * c, pitch_b = k_total + 8;
  std::uint64_t* filter_ready = reinterpret_cast<std::uint64_t*>(shared);  // one mbarrier a tap row
  T* b_tile = reinterpret_cast<T*>(shared + kBarrierBytes);
  T* const halo_base = b_tile + BN * pitch_b;  // two halo buffers, one after the other
  const int halo_elements = d.halo_rows * d.halo_pitch * pitch_a;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warp_m = warp / kWarpsN, warp_n = warp % kWarpsN;
  const int n0 = blockIdx.y * BN;
  int unit = blockIdx.x;
  if (unit >= d.units) return;

  // The filter rows, one bulk copy a row and tap row, each tap row counted on its own mbarrier,
  // so the first products start once tap row 0 is in. With clusters of MC blocks each block copies
  // every MC-th row into all of them: one L2 read for MC blocks. Rows past d.o are never copied
  // (their products land in columns that are not stored).
  if (threadIdx.x == 0) {
    for (int dh = 0; dh < d.kh; ++dh) tma::barrier_init(&filter_ready[dh], 1);
    tma::barrier_init_fence();
  }
  if constexpr (MC > 1) {  // every block's barriers exist before a copy of the cluster completes bytes on them
    cluster_arrive();
    cluster_wait();
  }
  if (warp == 0) {
    const int rank = MC > 1 ? static_cast<int>(tma::cluster_rank()) : 0, rows = min(BN, d.o - n0);
    const unsigned row_bytes = kw * c * 2;
    for (int dh = 0; dh < d.kh; ++dh) {
      if (lane == 0) tma::arrive_expect_bytes(&filter_ready[dh], rows * row_bytes);
      __syncwarp();
      for (int n = lane * MC + rank; n < rows; n += 32 * MC) {
        T* dst = b_tile + n * pitch_b + dh * kw * c;
        const T* src = b_rows + static_cast<std::int64_t>(n0 + n) * k_total + dh * kw * c;
        if constexpr (MC > 1)
          tma::load_bytes_to_blocks(dst, src, row_bytes, &filter_ready[dh], (1u << MC) - 1);
        else
          tma::load_bytes(dst, src, row_bytes, &filter_ready[dh]);
      }
    }
  }
  copy_halo(d, unit, x, halo_base);
  commit_async_group();
  __syncthreads();  // the mbarriers are initialised before anyone waits on them

  // B's ldmatrix rows for this lane: pairs of 8-column tiles of the warp's 32 columns.
  const std::uint32_t b_address =
      shared_address(b_tile + (warp_n * 32 + (lane & 7) + ((lane >> 4) << 3)) * pitch_b + ((lane >> 3) & 1) * 8);
  const std::uint32_t b_pair_bytes = 16 * pitch_b * 2;
  const int c_steps = c / 16;

  bool first = true;
  for (int buffer = 0; unit < d.units; unit += gridDim.x, buffer ^= 1, first = false) {
    const int next = unit + gridDim.x;
    if (next < d.units) copy_halo(d, next, x, halo_base + (buffer ^ 1) * halo_elements);
    commit_async_group();  // empty when there is no next unit
    wait_all_but_newest_group();  // this unit's halo (the next one's may fly)
    __syncthreads();

    const int oh0 = (unit % d.row_tiles) * d.tile_rows;
    const int pixels = min(d.tile_rows, d.oh - oh0) * d.ow;
    // This lane's A row address per piece: the halo pixel its output pixel's window starts at.
    std::uint32_t a_address[kMT];
    bool live[kMT];
#pragma unroll
    for (int i = 0; i < kMT; ++i) {
      const int piece = warp_m + i * kWarpsM;
      live[i] = piece * 16 < pixels;
      int m = piece * 16 + (lane & 15);
      if (m >= pixels) m = 0;  // a row past the unit's pixels reads pixel 0; its sums are not stored
      const int orow = m / d.ow, ocol = m - orow * d.ow;
      const int pixel = orow * d.stride * d.halo_pitch + ocol * d.stride;
      a_address[i] = shared_address(halo_base + buffer * halo_elements + pixel * pitch_a + (lane >> 4) * 8);
    }

    float acc[kMT][kNT][4] = {};
    std::uint32_t a[2][kMT][4], b[2][kNT][2];
    const auto load = [&](int slot, std::uint32_t a_off, std::uint32_t b_off) {
#pragma unroll
      for (int i = 0; i < kMT; ++i)
        if (live[i]) load_matrices(a[slot][i], a_address[i] + a_off);
#pragma unroll
      for (int j = 0; j < kNT; j += 2) {
        std::uint32_t m[4];
        load_matrices(m, b_address + (j / 2) * b_pair_bytes + b_off);
        b[slot][j][0] = m[0];
        b[slot][j][1] = m[1];
        b[slot][j + 1][0] = m[2];
        b[slot][j + 1][1] = m[3];
      }
    };
    const auto multiply = [&](int slot) {
#pragma unroll
      for (int i = 0; i < kMT; ++i)
        if (live[i]) {
#pragma unroll
          for (int j = 0; j < kNT; ++j) mma_16x8x16<T>(acc[i][j], a[slot][i], b[slot][j][0], b[slot][j][1]);
        }
    };

    for (int dh = 0; dh < d.kh; ++dh) {
      if (first) tma::wait(&filter_ready[dh], 0);  // the filter's tap row dh landed
      const std::uint32_t a_row = dh * d.halo_pitch * pitch_a * 2, b_row = dh * kw * c * 2;
      if constexpr (CS > 0 && KW > 0) {
        // The tap row's KW x CS steps unrolled: fragments of step s + 1 load before step s multiplies.
        constexpr int kSteps = KW * CS;
        load(0, a_row, b_row);
#pragma unroll
        for (int s = 0; s < kSteps; ++s) {
          if (s + 1 < kSteps) load((s + 1) & 1, a_row + a_step_offset<CS>(s + 1), b_row + (s + 1) * 32);
          multiply(s & 1);
        }
      } else {
        // Any c and kw: A advances 32 bytes a step and 16 more at each tap (the pixel pitch's spare
        // bytes); B 32 bytes a step.
        const int steps = kw * c_steps;
        std::uint32_t a_off = a_row, b_off = b_row;
        int c_step = 0;
        const auto advance = [&] {
          a_off += 32;
          b_off += 32;
          if (++c_step == c_steps) {
            c_step = 0;
            a_off += 16;
          }
        };
        load(0, a_off, b_off);
        advance();
        for (int s = 0; s < steps; s += 2) {
          if (s + 1 < steps) {
            load(1, a_off, b_off);
            advance();
          }
          multiply(0);
          if (s + 1 < steps) {
            if (s + 2 < steps) {
              load(0, a_off, b_off);
              advance();
            }
            multiply(1);
          }
        }
      }
    }

    // Epilogue: [+ bias] [relu], rounded once, two adjacent channels per store.
    const int img = unit / d.row_tiles;
#pragma unroll
    for (int i = 0; i < kMT; ++i) {
      if (!live[i]) continue;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int m = (warp_m + i * kWarpsM) * 16 + (lane >> 2) + half * 8;
        if (m >= pixels) continue;
        const int orow = m / d.ow, ocol = m - orow * d.ow;
        T* out = y + static_cast<std::int64_t>((img * d.oh + oh0 + orow) * d.ow + ocol) * d.o;
#pragma unroll
        for (int j = 0; j < kNT; ++j) {
          const int col = n0 + warp_n * 32 + j * 8 + (lane & 3) * 2;
          if (col >= d.o) continue;
          store_channel_pair(out, col, acc[i][j][2 * half], acc[i][j][2 * half + 1], bias, relu);
        }
      }
    }
    __syncthreads();  // every warp is done with this halo before the next iteration refills it
  }
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

ResidentDims resident_dims(const NhwcConvShape& g, int tile_rows) {
  const int oh = static_cast<int>(g.oh()), ow = static_cast<int>(g.ow());
  const int row_tiles = (oh + tile_rows - 1) / tile_rows;
  const int halo_cols = static_cast<int>((ow - 1) * g.stride + g.kw);
  // At stride 1 an ldmatrix's eight output pixels may cross an output row: a halo row pitch of ow
  // plus a multiple of 8 pixels keeps their rows in eight different bank groups (the pixel pitch is
  // an odd number of 16-byte units) where halo_cols would put two in one.
  const int halo_pitch = g.stride == 1 ? ow + (halo_cols - ow + 7) / 8 * 8 : halo_cols;
  return {static_cast<int>(g.n),      static_cast<int>(g.h),      static_cast<int>(g.w),
          static_cast<int>(g.c),      static_cast<int>(g.o),      static_cast<int>(g.kh),
          static_cast<int>(g.kw),     static_cast<int>(g.stride), static_cast<int>(g.padding),
          oh,                         ow,                         tile_rows,
          row_tiles,                  static_cast<int>(g.n) * row_tiles,
          static_cast<int>((tile_rows - 1) * g.stride + g.kh),
          halo_cols,                  halo_pitch};
}

std::size_t resident_shared_bytes(const ResidentDims& d, int bn) {
  return kBarrierBytes + (static_cast<std::size_t>(bn) * (d.kh * d.kw * d.c + 8) +
                          2 * static_cast<std::size_t>(d.halo_rows) * d.halo_pitch * (d.c + 8)) * 2;
}

template <typename T, int BN, int CS, int KW, int MC>
void launch(const ResidentDims& d, int blocks, const T* x, const T* b_rows, const T* bias, bool relu, T* y,
            cudaStream_t stream) {
  const int bytes = static_cast<int>(resident_shared_bytes(d, BN));
  auto* kernel = conv_nhwc_resident_kernel<T, BN, CS, KW, MC>;
  conv_direct::allow_shared(kernel, bytes);
  // Whole clusters along x (a block always has units: blocks <= units).
  const int whole = MC > 1 ? std::max(MC, blocks / MC * MC) : blocks;
  const LaunchGeometry geometry{dim3(static_cast<unsigned>(whole), static_cast<unsigned>((d.o + BN - 1) / BN)),
                                dim3(kThreads), static_cast<std::size_t>(bytes), static_cast<unsigned>(MC)};
  launch_in_clusters(kernel, geometry, stream, false, d, x, b_rows, bias, relu, y);
}

// The K walk unrolled for the shipped CNNs' layers (32 or 64 channels read, 3x3 or 5x5), else read from d.
template <typename T, int BN, int MC>
void launch_k(const ResidentDims& d, int blocks, const T* x, const T* b_rows, const T* bias, bool relu, T* y,
              cudaStream_t stream) {
  if (d.c == 32 && d.kw == 3) return launch<T, BN, 2, 3, MC>(d, blocks, x, b_rows, bias, relu, y, stream);
  if (d.c == 32 && d.kw == 5) return launch<T, BN, 2, 5, MC>(d, blocks, x, b_rows, bias, relu, y, stream);
  if (d.c == 64 && d.kw == 3) return launch<T, BN, 4, 3, MC>(d, blocks, x, b_rows, bias, relu, y, stream);
  if (d.c == 64 && d.kw == 5) return launch<T, BN, 4, 5, MC>(d, blocks, x, b_rows, bias, relu, y, stream);
  launch<T, BN, 0, 0, MC>(d, blocks, x, b_rows, bias, relu, y, stream);
}

}  // namespace

bool resident_conv_runs_here() {
  static const bool runs = current_device_attribute(cudaDevAttrComputeCapabilityMajor) == 9 &&
                           current_device_attribute(cudaDevAttrComputeCapabilityMinor) == 0;
  return runs;
}

ResidentSplit resident_split(const NhwcConvShape& g, int bn, int sm_count) {
  const std::int64_t oh = g.oh(), ow = g.ow();
  const std::int64_t column_blocks = (g.o + bn - 1) / bn;
  // One block a multiprocessor (a block takes most of its shared memory), shared by the column blocks.
  const std::int64_t slots = std::max<std::int64_t>(1, sm_count / column_blocks);
  ResidentSplit best;
  std::int64_t best_cost = -1;
  if (g.kh > kMaxTapRows) return best;
  for (std::int64_t rows = std::min<std::int64_t>(oh, kMaxUnitPixels / std::max<std::int64_t>(ow, 1)); rows >= 1;
       --rows) {
    // Units of fewer than four pieces spend more on their halo, barriers and epilogue than on products.
    if (rows * ow < 64 && rows < oh) break;
    if (resident_shared_bytes(resident_dims(g, static_cast<int>(rows)), bn) > kResidentMaxShared) continue;
    const std::int64_t units = g.n * ((oh + rows - 1) / rows);
    const std::int64_t blocks = std::min(units, slots);
    // A block's work: its units (the most any block walks) of 16-row pieces each, plus about two
    // pieces' time a unit for its halo copy, barriers and epilogue.
    const std::int64_t cost = (units + blocks - 1) / blocks * ((rows * ow + 15) / 16 + 2);
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      best = {static_cast<int>(rows), static_cast<int>(blocks)};
    }
  }
  return best;
}

template <typename T>
void launch_resident_conv(const NhwcConvShape& g, int bn, const ResidentSplit& split, const T* x, const T* b_rows,
                          const T* bias, bool relu, T* y, cudaStream_t stream) {
  const ResidentDims d = resident_dims(g, split.tile_rows);
  // Pairs of blocks share the filter's copies where there are two blocks to pair.
  const bool pair = split.blocks >= 2;
  if (bn == 64 && pair) return launch_k<T, 64, 2>(d, split.blocks, x, b_rows, bias, relu, y, stream);
  if (bn == 64) return launch_k<T, 64, 1>(d, split.blocks, x, b_rows, bias, relu, y, stream);
  if (pair) return launch_k<T, 32, 2>(d, split.blocks, x, b_rows, bias, relu, y, stream);
  launch_k<T, 32, 1>(d, split.blocks, x, b_rows, bias, relu, y, stream);
}
template void launch_resident_conv<__half>(const NhwcConvShape&, int, const ResidentSplit&, const __half*,
                                           const __half*, const __half*, bool, __half*, cudaStream_t);
template void launch_resident_conv<__nv_bfloat16>(const NhwcConvShape&, int, const ResidentSplit&,
                                                  const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                                                  bool, __nv_bfloat16*, cudaStream_t);

}  // namespace sg::cuda::nhwc_conv
