// The halo form of the channels-last tensor-core convolution
// (ops/cuda/fast_paths/tensor_core_conv/conv_nhwc_mma.hpp): one block (four warps) computes `tile_rows`
// whole output rows of one image (at most 128 or 256 pixels) for BN output
// channels. It copies the input window those rows read (the halo: all
// channels of (tile_rows - 1) * stride + kh input rows, every padded column,
// zeros in the padding) and its BN rows of the rewritten filter into shared
// memory ONCE, then runs the whole K walk (tap by tap, 16 channels a step)
// from shared memory with no further copies or barriers: each tap's A
// operand is the same halo read at shifted pixel addresses, which ldmatrix
// takes per lane. The GEMM form re-reads every input element once per tap
// and pays a barrier per K step; the per-step work of these small layers
// was mostly that overhead.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "ops/cuda/conv_direct_common.cuh"
#include "ops/cuda/fast_paths/tensor_core_conv/conv_nhwc_common.cuh"
#include "ops/cuda/fast_paths/tensor_core_conv/conv_nhwc_halo.hpp"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/launch_config.cuh"
#include "ops/cuda/mma_fragments.cuh"

namespace sg::cuda::nhwc_conv {
namespace {

constexpr int kThreads = 128;  // four warps; warp w takes the 16-row pieces w, w + 4, ...

struct HaloDims {
  int n, h, w, c, o, kh, kw, stride, padding, oh, ow;
  int tile_rows, row_tiles, halo_rows, halo_cols;
};

// Walks a [count / per_row, per_row] index space in steps of kThreads without
// dividing per step: (row, col) of this thread's current element.
struct StridedWalk {
  int row, col;
  int row_step, col_step;
  __device__ StridedWalk(int start, int per_row)
      : row(start / per_row), col(start % per_row), row_step(kThreads / per_row), col_step(kThreads % per_row) {}
  __device__ void advance(int per_row) {
    row += row_step;
    col += col_step;
    if (col >= per_row) {
      col -= per_row;
      ++row;
    }
  }
};

template <typename T, int BN, int MT>
__global__ void __launch_bounds__(kThreads)
    conv_nhwc_halo_kernel(HaloDims d, const T* __restrict__ x, const T* __restrict__ b_rows,
                          const T* __restrict__ bias, bool relu, T* __restrict__ y) {
  constexpr int kNTiles = BN / 8;
  extern __shared__ __align__(16) unsigned char shared[];
  // Pitches (elements) with 16 spare bytes: a row is an odd number of 16-byte units, so
  // ldmatrix's eight rows hit every bank once (c and taps * c are multiples of 16).
  const int pitch_a = d.c + 8, k_total = d.kh * d.kw * d.c, pitch_b = k_total + 8;
  T* halo = reinterpret_cast<T*>(shared);
  T* b_tile = halo + d.halo_rows * d.halo_cols * pitch_a;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int img = blockIdx.x / d.row_tiles, oh0 = (blockIdx.x % d.row_tiles) * d.tile_rows;
  const int rows = min(d.tile_rows, d.oh - oh0) * d.ow;  // output pixels of this block
  const int n0 = blockIdx.y * BN;

  // The halo: every channel of its pixels, zero outside the image.
  {
    const int per_pixel = d.c / 8, total = d.halo_rows * d.halo_cols * per_pixel;
    const int top = oh0 * d.stride - d.padding;
    StridedWalk at(tid, per_pixel);  // (pixel, chunk)
    int hr = at.row / d.halo_cols, hc = at.row % d.halo_cols, pixel = at.row;
    for (int i = tid; i < total; i += kThreads) {
      const int ih = top + hr, iw = hc - d.padding;
      const bool valid = static_cast<unsigned>(ih) < static_cast<unsigned>(d.h) &&
                         static_cast<unsigned>(iw) < static_cast<unsigned>(d.w);
      const T* src = valid ? x + (static_cast<std::int64_t>((img * d.h + ih) * d.w + iw) * d.c + at.col * 8) : x;
      copy16_or_zero(shared_address(halo + pixel * pitch_a + at.col * 8), src, valid);
      at.advance(per_pixel);
      hc += at.row - pixel;
      pixel = at.row;
      while (hc >= d.halo_cols) {
        hc -= d.halo_cols;
        ++hr;
      }
    }
  }
  // The block's filter rows, resident for the whole K walk: [BN][taps * c] of the rewritten filter.
  {
    const int per_row = k_total / 8, total = BN * per_row;
    StridedWalk at(tid, per_row);  // (filter row, chunk)
    for (int i = tid; i < total; i += kThreads) {
      const bool valid = n0 + at.row < d.o;
      const T* src = valid ? b_rows + (static_cast<std::int64_t>(n0 + at.row) * k_total + at.col * 8) : b_rows;
      copy16_or_zero(shared_address(b_tile + at.row * pitch_b + at.col * 8), src, valid);
      at.advance(per_row);
    }
  }
  asm volatile("cp.async.commit_group;\n" ::);
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  __syncthreads();

  // This lane's ldmatrix row addresses: for A (one per 16-row piece) the halo pixel its output
  // pixel's window starts at, for B its row of each pair of 8-column pieces.
  std::uint32_t a_address[MT];
  bool piece_live[MT];
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    const int piece = warp + 4 * i;
    piece_live[i] = piece * 16 < rows;
    int m = piece * 16 + (lane & 15);
    if (m >= rows) m = 0;  // a row past the block's pixels reads pixel 0; its sums are not stored
    const int orow = m / d.ow, ocol = m - orow * d.ow;
    const int pixel = orow * d.stride * d.halo_cols + ocol * d.stride;
    a_address[i] = shared_address(halo + pixel * pitch_a + (lane >> 4) * 8);
  }
  const std::uint32_t b_address =
      shared_address(b_tile + ((lane & 7) + ((lane >> 4) << 3)) * pitch_b + ((lane >> 3) & 1) * 8);

  float acc[MT][kNTiles][4] = {};
  for (int dh = 0; dh < d.kh; ++dh)
    for (int dw = 0; dw < d.kw; ++dw) {
      const std::uint32_t a_tap = (dh * d.halo_cols + dw) * pitch_a * 2;
      const std::uint32_t b_tap = (dh * d.kw + dw) * d.c * 2;
      for (int c0 = 0; c0 < d.c; c0 += 16) {
        std::uint32_t b[kNTiles][2];
#pragma unroll
        for (int j = 0; j < kNTiles; j += 2) {
          std::uint32_t m[4];
          load_matrices(m, b_address + j * 8 * pitch_b * 2 + b_tap + c0 * 2);
          b[j][0] = m[0];
          b[j][1] = m[1];
          b[j + 1][0] = m[2];
          b[j + 1][1] = m[3];
        }
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          if (!piece_live[i]) continue;
          std::uint32_t a[4];
          load_matrices(a, a_address[i] + a_tap + c0 * 2);
#pragma unroll
          for (int j = 0; j < kNTiles; ++j) mma_16x8x16<T>(acc[i][j], a, b[j][0], b[j][1]);
        }
      }
    }

  // Epilogue: [+ bias] [relu], rounded once, two adjacent channels per store.
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    if (!piece_live[i]) continue;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int m = (warp + 4 * i) * 16 + (lane >> 2) + half * 8;
      if (m >= rows) continue;
      const int orow = m / d.ow, ocol = m - orow * d.ow;
      T* out = y + (static_cast<std::int64_t>((img * d.oh + oh0 + orow) * d.ow + ocol)) * d.o;
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
        const int col = n0 + j * 8 + (lane & 3) * 2;
        if (col >= d.o) continue;
        store_channel_pair(out, col, acc[i][j][2 * half], acc[i][j][2 * half + 1], bias, relu);
      }
    }
  }
}

HaloDims halo_dims(const NhwcConvShape& g, int tile_rows) {
  const int oh = static_cast<int>(g.oh()), ow = static_cast<int>(g.ow());
  return {static_cast<int>(g.n),      static_cast<int>(g.h),  static_cast<int>(g.w),
          static_cast<int>(g.c),      static_cast<int>(g.o),  static_cast<int>(g.kh),
          static_cast<int>(g.kw),     static_cast<int>(g.stride), static_cast<int>(g.padding),
          oh,                         ow,                     tile_rows,
          (oh + tile_rows - 1) / tile_rows,
          static_cast<int>((tile_rows - 1) * g.stride + g.kh),
          static_cast<int>((ow - 1) * g.stride + g.kw)};
}

std::size_t halo_shared_bytes(const HaloDims& d, int bn) {
  return (static_cast<std::size_t>(d.halo_rows) * d.halo_cols * (d.c + 8) +
          static_cast<std::size_t>(bn) * (d.kh * d.kw * d.c + 8)) * 2;
}

template <typename T, int BN, int MT>
void launch_halo(const HaloDims& d, const T* x, const T* b_rows, const T* bias, bool relu, T* y, cudaStream_t stream) {
  const int bytes = static_cast<int>(halo_shared_bytes(d, BN));
  auto* kernel = conv_nhwc_halo_kernel<T, BN, MT>;
  conv_direct::allow_shared(kernel, bytes);
  const dim3 grid(static_cast<unsigned>(d.n * d.row_tiles), static_cast<unsigned>((d.o + BN - 1) / BN));
  kernel<<<grid, kThreads, bytes, stream>>>(d, x, b_rows, bias, relu, y);
  SG_LAUNCH_CHECK("conv_nhwc_halo_kernel");
}

}  // namespace

int halo_tile_rows(const NhwcConvShape& g, int bn, int pieces_per_warp) {
  const std::int64_t oh = g.oh(), ow = g.ow(), most = 4 * 16 * pieces_per_warp;
  if (ow > most) return 0;
  // As few blocks per image as hold its rows (at most `most` pixels each), their rows shared out evenly.
  const std::int64_t blocks = (oh * ow + most - 1) / most;
  int rows = static_cast<int>(std::min<std::int64_t>((oh + blocks - 1) / blocks, most / ow));
  for (; rows >= 1; --rows)
    if (halo_shared_bytes(halo_dims(g, rows), bn) <= kHaloMaxShared) return rows;
  return 0;
}

template <typename T>
void launch_halo_conv(const NhwcConvShape& g, int bn, int pieces_per_warp, int tile_rows, const T* x,
                      const T* b_rows, const T* bias, bool relu, T* y, cudaStream_t stream) {
  const HaloDims d = halo_dims(g, tile_rows);
  if (bn == 64) return launch_halo<T, 64, 2>(d, x, b_rows, bias, relu, y, stream);
  if (pieces_per_warp == 4) return launch_halo<T, 32, 4>(d, x, b_rows, bias, relu, y, stream);
  return launch_halo<T, 32, 2>(d, x, b_rows, bias, relu, y, stream);
}
template void launch_halo_conv<__half>(const NhwcConvShape&, int, int, int, const __half*, const __half*,
                                       const __half*, bool, __half*, cudaStream_t);
template void launch_halo_conv<__nv_bfloat16>(const NhwcConvShape&, int, int, int, const __nv_bfloat16*,
                                              const __nv_bfloat16*, const __nv_bfloat16*, bool, __nv_bfloat16*,
                                              cudaStream_t);

}  // namespace sg::cuda::nhwc_conv
