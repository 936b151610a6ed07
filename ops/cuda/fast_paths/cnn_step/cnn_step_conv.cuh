#pragma once
// The CNN step's convolutions (kernel 1, cnn_step.cu, which alone includes
// this): each an implicit GEMM on tensor cores over one example's
// activations in shared memory, its operands gathered through index tables,
// its work cut evenly over the block's warps. Not the kernels of
// conv_implicit_gemm.cu / conv_direct.cu: those are f32 FMAs over a whole NCHW
// batch in global memory; only the window geometry (conv_window.cuh) is the
// same computation. In an unnamed namespace, as in the kernel's own file.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "ops/cuda/conv_window.cuh"
#include "ops/cuda/fast_paths/cnn_step/cnn_step_shapes.cuh"
#include "ops/cuda/mma_fragments.cuh"
#include "ops/cuda/warp_reduce.cuh"

namespace sg::cuda {
namespace {

// A block's gradient sum: the first example of the block writes, later ones add.
__device__ __forceinline__ void accumulate(float* p, float v, bool first) { *p = first ? v : *p + v; }

// Each convolution of an example is an implicit GEMM C[M][N] = sum_k A[m][k]
// B[k][n] (mma.m16n8k16: fp16 or bf16 operands, T, which the graph's values
// are exactly, and fp32 sums), its A gathered from an activation in shared
// memory, so nothing is unfolded:
//   forward          C = out [pos][co]   A = in unfolded [pos][tap]           B = W [tap][co]
//   weight gradient  C = dW^T [tap][co]  A = in unfolded^T [tap][pos]         B = dY^T [pos][co]
//   data gradient    C = dX [pos][ci]    A = dY bordered, unfolded [pos][tap]  B = W flipped [tap][ci]
// A's element (row, column) is src[row.offset + column.offset]: one index is
// a window (its corner in the input) and the other a tap (its displacement),
// so the forward and the weight gradient are the same gather with rows and
// columns swapped. With padding a window reaches outside the input, and the
// sum of corner and displacement is bounds-checked. The data gradient runs
// on a copy of dY dilated by the stride with a zero border, which needs no
// check.
// In a lane's fragments, rows are g = lane/4 and g+8, columns (k) 2t, 2t+1,
// 2t+8, 2t+9 with t = lane%4; `column_of(t, j)` is the j-th of those.
__device__ __forceinline__ int column_of(int t, int j) { return 2 * t + (j & 1) + (j >> 1) * 8; }
// A lane's A registers from its values v[row r][j-th column] (T-representable:
// the graph's fp16 or bf16 values), packed as the T pairs mma reads.
template <class T>
__device__ __forceinline__ void a_fragment(const float (&v)[2][4], std::uint32_t (&a)[4]) {
  a[0] = pack_floats<T>(v[0][0], v[0][1]);
  a[1] = pack_floats<T>(v[1][0], v[1][1]);
  a[2] = pack_floats<T>(v[0][2], v[0][3]);
  a[3] = pack_floats<T>(v[1][2], v[1][3]);
}
// Where a lane's accumulator c[i] sits in C: row m0 + g + 8 (i / 2), column n0 + 2t + i % 2.
__device__ __forceinline__ int c_row(int m0, int g, int i) { return m0 + g + (i >> 1) * 8; }
__device__ __forceinline__ int c_col(int n0, int t, int i) { return n0 + 2 * t + (i & 1); }

template <bool Padded>
__device__ __forceinline__ float gather(const float* src, int h, int w, int2 row, int2 column) {
  if (Padded) {  // kNoIndex's dy (-32768) fails the bounds check too
    const int y = index_dy(row.y) + index_dy(column.y), x = index_dx(row.y) + index_dx(column.y);
    return y >= 0 && y < h && x >= 0 && x < w ? src[row.x + column.x] : 0.f;
  }
  return row.y != kNoIndex && column.y != kNoIndex ? src[row.x + column.x] : 0.f;
}

// B from staged rows of T: column n of B is row n, its k contiguous with
// zeros past K. Columns past N give C columns that are never stored, so they
// read the last row again instead of rows of zeros.
template <class T>
struct StagedRows {
  const T* w;
  int stride, last_row;
  __device__ __forceinline__ void operator()(int n, int k, std::uint32_t& b0, std::uint32_t& b1) const {
    const T* p = w + min(n, last_row) * stride + k;
    b0 = *reinterpret_cast<const std::uint32_t*>(p);
    b1 = *reinterpret_cast<const std::uint32_t*>(p + 8);
  }
};

// C = A B over the block's warps. The work, units (a 16-row tile by NT
// column tiles) of K/16 mma steps each laid end to end, is cut into ranges
// of ceil(work / warps) steps, one per warp, so no warp does more steps than
// that whatever the shape. A unit cut between warps is summed in warp order:
// a warp whose range ends inside a unit leaves that piece in its slot
// (warps x NT x 128 floats), and after a barrier the warp holding the unit's
// final piece adds the slots before it to its own. The order is fixed by the
// shape, so every run gives the same bits. `rows` and `columns` hold A's
// row and column indices (M and K rounded up to 16), `b_of` gives a lane's
// B registers and `store(m, n, c)` takes each element of C. Every thread of
// the block calls it.
template <class T, int NT, bool Padded, class BOf, class Store>
__device__ void block_gemm(const Block& b, int M, int N, int K, const float* src, int src_h, int src_w,
                           const int2* rows, const int2* columns, BOf b_of, Store store, float* slots) {
  const int g = b.lane >> 2, t = b.lane & 3;
  const int groups = (N + 8 * NT - 1) / (8 * NT), steps = (K + 15) / 16, total = (M + 15) / 16 * groups * steps;
  const int per = (total + b.warps - 1) / b.warps;
  const auto finish = [&](int m0, int n0, const float (&c)[NT][4]) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int m = c_row(m0, g, i), n = c_col(n0 + 8 * nt, t, i);
        if (m < M && n < N) store(m, n, c[nt][i]);
      }
  };
  const auto slot = [&](int warp, int nt, int i) -> float& { return slots[((warp * NT + nt) * 4 + i) * 32 + b.lane]; };
  float held[NT][4];  // a unit's final piece, when earlier warps began the unit
  int held_unit = -1, held_m0 = 0, held_n0 = 0;
  const int begin = min(total, b.warp * per), end = min(total, begin + per);
  int unit = begin / steps, s0 = begin - unit * steps;
  int tile_m = unit / groups, group = unit - tile_m * groups;
  for (int at = begin; at < end; ++unit, s0 = 0) {
    const int s1 = min(steps, s0 + end - at), m0 = tile_m * 16, n0 = group * 8 * NT;
    const int2 row[2] = {rows[m0 + g], rows[m0 + g + 8]};
    float c[NT][4] = {};
#pragma unroll 2
    for (int s = s0; s < s1; ++s) {
      const int k0 = s * 16;
      float v[2][4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int2 column = columns[k0 + column_of(t, j)];
#pragma unroll
        for (int r = 0; r < 2; ++r) v[r][j] = gather<Padded>(src, src_h, src_w, row[r], column);
      }
      std::uint32_t a[4];
      a_fragment<T>(v, a);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        std::uint32_t b0, b1;
        b_of(n0 + 8 * nt + g, k0 + 2 * t, b0, b1);
        mma_16x8x16<T>(c[nt], a, b0, b1);
      }
    }
    if (s1 < steps) {  // the unit goes on in the next warp
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) slot(b.warp, nt, i) = c[nt][i];
    } else if (s0 > 0) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) held[nt][i] = c[nt][i];
      held_unit = unit;
      held_m0 = m0;
      held_n0 = n0;
    } else {
      finish(m0, n0, c);
    }
    at += s1 - s0;
    if (++group == groups) {
      group = 0;
      ++tile_m;
    }
  }
  __syncthreads();
  if (held_unit < 0) return;
  // Every warp before this one has a whole range; those from the one holding
  // the unit's first step on each left a piece of it.
  float c[NT][4] = {};
  for (int w = held_unit * steps / per; w < b.warp; ++w) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) c[nt][i] += slot(w, nt, i);
  }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) c[nt][i] += held[nt][i];
  finish(held_m0, held_n0, c);
}

template <class T, bool Padded>
__device__ void conv_forward(const Block& b, const CnnLayer& L, const float* in, float* out, const T* weights,
                             const float* bias, const int2* windows, const int2* taps, float* slots) {
  const int K = L.in_c * L.kernel_h * L.kernel_w, N = L.out_c, M = L.out_h * L.out_w;
  block_gemm<T, kColumnTiles, Padded>(b, M, N, K, in, L.in_h, L.in_w, windows, taps,
                                      StagedRows<T>{weights, forward_stride(L), N - 1},
                                      [&](int m, int n, float c) { out[n * M + m] = rounded<T>(c + bias[n]); }, slots);
}

// Conv weight and bias gradients of one example, added to the block's slice.
// dY^T, B of the GEMM, is first staged as rows of T [co][pos] in `scratch`.
template <class T, bool Padded>
__device__ void conv_weight_gradient(const Block& b, const CnnLayer& L, const float* gy, const float* in,
                                     const int2* windows, const int2* taps, float* scratch, float* slots, float* dW,
                                     float* db, bool first) {
  const int M = L.in_c * L.kernel_h * L.kernel_w, N = L.out_c, K = L.out_h * L.out_w, ks = dy_stride(L);
  T* dy = reinterpret_cast<T*>(scratch);
  for (int co = b.warp; co < N; co += b.warps)  // zeros past K
    for (int k = b.lane; k < ks; k += 32) dy[co * ks + k] = to_compute<T>(k < K ? gy[co * K + k] : 0.f);
  for (int co = b.warp; co < N; co += b.warps) {  // bias: a warp per channel
    float sum = 0.f;
    for (int k = b.lane; k < K; k += 32) sum += gy[co * K + k];
    sum = warp_sum(sum);
    if (b.lane == 0) accumulate(db + co, sum, first);
  }
  __syncthreads();
  block_gemm<T, kColumnTiles, Padded>(b, M, N, K, in, L.in_h, L.in_w, taps, windows, StagedRows<T>{dy, ks, N - 1},
                                      [&](int m, int n, float c) { accumulate(dW + n * M + m, c, first); }, slots);
}

// The data gradient: a correlation of dY, dilated by the stride and with a
// zero border, with the flipped kernel; no operand needs a check. The
// layer's copy `bordered` keeps the zeros kernel 1 writes once per block: each
// example writes only dY's elements into it.
template <class T>
__device__ void conv_data_gradient(const Block& b, const CnnLayer& L, const float* gy, float* bordered, float* g_in,
                                   const T* weights, const int2* rows, const int2* columns, float* slots) {
  const int kk = L.kernel_h * L.kernel_w, K = L.out_c * kk, N = L.in_c, M = L.in_h * L.in_w;
  const int bh = transposed_padding(L.kernel_h, L.padding), bw = transposed_padding(L.kernel_w, L.padding);
  const int height = L.in_h + L.kernel_h - 1, width = L.in_w + L.kernel_w - 1, bplane = height * width;
  for (int co = b.warp; co < L.out_c; co += b.warps)  // a warp per channel of dY
    for (int oy = 0; oy < L.out_h; ++oy) {
      const int y = oy * L.stride + bh;
      for (int ox = b.lane; ox < L.out_w; ox += 32) {
        const int x = ox * L.stride + bw;  // a negative border cuts off elements no tap reads
        if (y >= 0 && y < height && x >= 0 && x < width)
          bordered[co * bplane + y * width + x] = gy[(co * L.out_h + oy) * L.out_w + ox];
      }
    }
  __syncthreads();
  block_gemm<T, kColumnTiles, false>(b, M, N, K, bordered, 0, 0, rows, columns,
                                     StagedRows<T>{weights, data_stride(L), N - 1},
                                     [&](int m, int n, float c) { g_in[n * M + m] = rounded<T>(c); }, slots);
}

}  // namespace
}  // namespace sg::cuda
