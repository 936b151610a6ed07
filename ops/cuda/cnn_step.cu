// The CNN training step in two kernels (cnn_step.hpp says why). Kernel 1
// reads top to bottom as one example's step: stage the weights (once per
// block), fetch, each layer's forward, the loss, each layer's backward in
// reverse, with a barrier between layers. Convolutions are implicit GEMMs on
// tensor cores whose operands are gathered from the activations through
// index tables; everything else is a plain loop over the layer's elements.
#include <cuda_fp16.h>

#include <fmt/format.h>

#include <algorithm>

#include "ops/cuda/cnn_step.hpp"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/mma_fragments.cuh"
#include "ops/cuda/sgd_step.cuh"
#include "ops/cuda/warp_reduce.cuh"
#include "ops/philox.hpp"

namespace sg::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kUpdateThreads = 256;

// The value an fp16 tensor of the graph holds.
__device__ __forceinline__ float rounded(float x) { return __half2float(__float2half_rn(x)); }

// Two fp32 values (fp16-representable: the graph's fp16 values) as the
// packed fp16 pair an mma operand register holds.
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&h);
}

__host__ __device__ constexpr int round_up(int x, int m) { return (x + m - 1) / m * m; }

// A block's gradient sum: the first example of the block writes, later ones add.
__device__ __forceinline__ void accumulate(float* p, float v, bool first) { *p = first ? v : *p + v; }

struct Block {
  float* smem;
  int tid, threads, warp, lane, warps;
};

// Profiling (CnnStepArgs::phase_clock): thread 0 of block 0 stores the clock
// at phase `k`, for its first example only; the callers sit after a barrier.
__device__ __forceinline__ void mark_phase(unsigned long long* clock, int k, bool first) {
  if (clock && first && blockIdx.x == 0 && threadIdx.x == 0) {
    unsigned long long ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    clock[k] = ns;
  }
}

// ---- conv2d on tensor cores ---------------------------------------------
// Each convolution of an example is an implicit GEMM C[M][N] = sum_k
// A[m][k] B[k][n], a warp per 16 x 8 tile of C, 16 k per mma.m16n8k16
// (mma_fragments.cuh: fp16 operands, which the graph's fp16 values are
// exactly, and fp32 sums). Operands come straight from the activations in
// shared memory through a per-layer index table, so nothing is unfolded:
//   forward          C = out [pos][co]  A = in unfolded [pos][tap]         B = W [tap][co]
//   data gradient    C = g_in [pos][ci] A = g unfolded [pos][(co, ky, kx)] B = W [(co, ky, kx)][ci]
//   weight gradient  C = dW [co][tap]   A = g [co][pos]                     B = in unfolded [pos][tap]
// In a lane's fragments, rows are g = lane/4 and g+8, columns (k) 2t, 2t+1,
// 2t+8, 2t+9 with t = lane%4; `column_of(t, j)` is the j-th of those.
__device__ __forceinline__ int column_of(int t, int j) { return 2 * t + (j & 1) + (j >> 1) * 8; }
// A lane's A registers from its values v[row r][j-th column].
__device__ __forceinline__ void a_fragment(const float (&v)[2][4], std::uint32_t (&a)[4]) {
  a[0] = pack2(v[0][0], v[0][1]);
  a[1] = pack2(v[1][0], v[1][1]);
  a[2] = pack2(v[0][2], v[0][3]);
  a[3] = pack2(v[1][2], v[1][3]);
}
// One mma with B from staged fp16 weights: `w` is this lane's column (n0 + g) at k0 + 2t.
__device__ __forceinline__ void mma_staged(float (&c)[4], const float (&v)[2][4], const __half* w) {
  std::uint32_t a[4];
  a_fragment(v, a);
  mma_16x8x16(c, a, *reinterpret_cast<const std::uint32_t*>(w), *reinterpret_cast<const std::uint32_t*>(w + 8));
}
// Where a lane's accumulator c[i] sits in C: row m0 + g + 8 (i / 2), column n0 + 2t + i % 2.
__device__ __forceinline__ int c_row(int m0, int g, int i) { return m0 + g + (i >> 1) * 8; }
__device__ __forceinline__ int c_col(int n0, int t, int i) { return n0 + 2 * t + (i & 1); }

// Row strides of the staged fp16 weights (CnnStepLaunch::weight_offset):
// a conv layer's forward B is [co][tap], its data gradient's B [ci][(co, ky, kx)],
// each row padded to 16 k and 8 more halves, so the 8 rows a warp's B
// fragment reads fall in different banks.
__host__ __device__ inline int forward_stride(const CnnLayer& L) {
  return round_up(L.in_c * L.kernel_h * L.kernel_w, 16) + 8;
}
__host__ __device__ inline int data_stride(const CnnLayer& L) {
  return round_up(L.out_c * L.kernel_h * L.kernel_w, 16) + 8;
}
// Whether a conv layer's data gradient runs on a zero-bordered copy of dY.
__host__ __device__ inline bool bordered_data_gradient(const CnnLayer& L) {
  return L.input_gradient && L.stride == 1 && L.padding < L.kernel_h && L.padding < L.kernel_w;
}
__host__ __device__ inline int bordered_size(const CnnLayer& L) {
  return L.out_c * (L.out_h + 2 * (L.kernel_h - 1 - L.padding)) * (L.out_w + 2 * (L.kernel_w - 1 - L.padding));
}

// Once per block (kernel 1 updates no parameter): every layer's weights as
// their fp16 cast (the graph's cast nodes) and its bias rounded the same, in
// the layouts the layers' loops read; zeros in every padding.
__device__ void stage_parameters(const Block& b, const CnnStepArgs& a, const CnnStepLaunch& l) {
  float* const smem = b.smem;
  for (int i = b.tid; i < l.weights_floats; i += b.threads) smem[l.weights_offset + i] = 0.f;
  __syncthreads();
  for (int li = 0; li < a.layers; ++li) {
    const CnnLayer L = a.layer[li];  // a copy in registers, as in the kernel's layer loops
    if (L.op != CnnLayerOp::conv2d && L.op != CnnLayerOp::linear) continue;
    const float* W = a.param[L.weight];
    const int k_count = L.op == CnnLayerOp::conv2d ? L.in_c * L.kernel_h * L.kernel_w : L.in_c * L.in_h * L.in_w;
    const int stride = L.op == CnnLayerOp::conv2d ? forward_stride(L) : k_count;
    __half* dst = reinterpret_cast<__half*>(smem + l.weight_offset[li]);
    for (int row = b.warp; row < L.out_c; row += b.warps) {  // a warp per output row, coalesced
      const float* src = W + std::int64_t(row) * k_count;
#pragma unroll 4
      for (int k = b.lane; k < k_count; k += 32) dst[row * stride + k] = __float2half_rn(__ldg(src + k));
    }
    for (int j = b.tid; j < L.out_c; j += b.threads) smem[l.bias_offset[li] + j] = rounded(__ldg(a.param[L.bias] + j));
  }
  __syncthreads();
  for (int li = 0; li < a.layers; ++li) {  // data-gradient layouts, from the forward ones
    const CnnLayer L = a.layer[li];
    if (L.op != CnnLayerOp::conv2d || !L.input_gradient) continue;
    const int kk = L.kernel_h * L.kernel_w, fs = forward_stride(L), ds = data_stride(L);
    const __half* f = reinterpret_cast<const __half*>(smem + l.weight_offset[li]);
    __half* d = reinterpret_cast<__half*>(smem + l.weight_t_offset[li]);
    for (int pair = b.warp; pair < L.in_c * L.out_c; pair += b.warps) {  // a warp per (ci, co) kernel
      const int ci = pair / L.out_c, co = pair % L.out_c;
      for (int k = b.lane; k < kk; k += 32) d[ci * ds + co * kk + k] = f[co * fs + ci * kk + k];
    }
  }
  __syncthreads();
}

// Padded: some windows reach outside the input (padding > 0), so every
// operand is bounds-checked; without padding none is.
template <bool Padded>
__device__ void conv_forward(const Block& b, const CnnLayer& L, const float* in, float* out, const __half* weights,
                             const float* bias, int2* table) {
  const int kk = L.kernel_h * L.kernel_w, K = L.in_c * kk, kp = round_up(K, 16), N = L.out_c, ws = forward_stride(L);
  const int M = L.out_h * L.out_w, in_plane = L.in_h * L.in_w;
  for (int k = b.tid; k < kp; k += b.threads) {  // tap -> (offset in the input, ky, kx); -1: padding of K
    const int ci = k / kk, ky = (k % kk) / L.kernel_w, kx = k % L.kernel_w;
    table[k] = k < K ? make_int2(ci * in_plane + ky * L.in_w + kx, (ky << 16) | kx) : make_int2(0, -1);
  }
  __syncthreads();
  const int g = b.lane >> 2, t = b.lane & 3, tiles_n = round_up(N, 8) / 8, tiles = round_up(M, 16) / 16 * tiles_n;
  for (int tile = b.warp; tile < tiles; tile += b.warps) {
    const int m0 = tile / tiles_n * 16, n0 = tile % tiles_n * 8;
    int y0[2], x0[2];
    bool row_ok[2];
    for (int r = 0; r < 2; ++r) {
      const int m = m0 + g + 8 * r;
      row_ok[r] = m < M;
      y0[r] = (m / L.out_w) * L.stride - L.padding;
      x0[r] = (m % L.out_w) * L.stride - L.padding;
    }
    float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 2
    for (int k0 = 0; k0 < kp; k0 += 16) {
      float v[2][4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int2 e = table[k0 + column_of(t, j)];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          bool ok = row_ok[r] && e.y >= 0;
          if (Padded) {
            const int iy = y0[r] + (e.y >> 16), ix = x0[r] + (e.y & 0xffff);
            ok = ok && iy >= 0 && iy < L.in_h && ix >= 0 && ix < L.in_w;
          }
          v[r][j] = ok ? in[e.x + y0[r] * L.in_w + x0[r]] : 0.f;
        }
      }
      mma_staged(c, v, weights + (n0 + g) * ws + k0 + 2 * t);
    }
    for (int i = 0; i < 4; ++i) {
      const int m = c_row(m0, g, i), n = c_col(n0, t, i);
      if (m < M && n < N) out[n * M + m] = rounded(c[i] + bias[n]);
    }
  }
}

// The data gradient of any convolution (strided, or padded beyond the
// kernel): each operand tests whether its output exists.
__device__ void conv_data_gradient(const Block& b, const CnnLayer& L, const float* gy, float* g_in,
                                   const __half* weights, int2* table) {
  const int s = L.stride;
  const int kk = L.kernel_h * L.kernel_w, K = L.out_c * kk, kp = round_up(K, 16), N = L.in_c, ws = data_stride(L);
  const int M = L.in_h * L.in_w, plane = L.out_h * L.out_w;
  for (int k = b.tid; k < kp; k += b.threads) {  // (co, ky, kx) -> (co's plane, ky, kx)
    const int co = k / kk, ky = (k % kk) / L.kernel_w, kx = k % L.kernel_w;
    table[k] = k < K ? make_int2(co * plane, (ky << 16) | kx) : make_int2(0, -1);
  }
  __syncthreads();
  const int g = b.lane >> 2, t = b.lane & 3, tiles_n = round_up(N, 8) / 8, tiles = round_up(M, 16) / 16 * tiles_n;
  for (int tile = b.warp; tile < tiles; tile += b.warps) {
    const int m0 = tile / tiles_n * 16, n0 = tile % tiles_n * 8;
    int ty[2], tx[2];
    bool row_ok[2];
    for (int r = 0; r < 2; ++r) {
      const int m = m0 + g + 8 * r;
      row_ok[r] = m < M;
      ty[r] = m / L.in_w + L.padding;
      tx[r] = m % L.in_w + L.padding;
    }
    float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 2
    for (int k0 = 0; k0 < kp; k0 += 16) {
      float v[2][4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int2 e = table[k0 + column_of(t, j)];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          int sy = ty[r] - (e.y >> 16), sx = tx[r] - (e.y & 0xffff);
          const bool ok = row_ok[r] && e.y >= 0 && sy >= 0 && sx >= 0 && sy % s == 0 && sx % s == 0;
          sy /= s;
          sx /= s;
          v[r][j] = ok && sy < L.out_h && sx < L.out_w ? gy[e.x + sy * L.out_w + sx] : 0.f;
        }
      }
      mma_staged(c, v, weights + (n0 + g) * ws + k0 + 2 * t);
    }
    for (int i = 0; i < 4; ++i) {
      const int m = c_row(m0, g, i), n = c_col(n0, t, i);
      if (m < M && n < N) g_in[n * M + m] = rounded(c[i]);
    }
  }
}

// The data gradient of a stride-1 convolution as a correlation of dY,
// copied with a zero border of kernel-1-padding (`bordered`), with the
// flipped kernel: no operand needs a bounds check.
__device__ void conv_data_gradient_bordered(const Block& b, const CnnLayer& L, const float* gy, float* bordered,
                                            float* g_in, const __half* weights, int* table) {
  const int kk = L.kernel_h * L.kernel_w, K = L.out_c * kk, kp = round_up(K, 16), N = L.in_c, ws = data_stride(L);
  const int M = L.in_h * L.in_w, plane = L.out_h * L.out_w;
  const int bh = L.kernel_h - 1 - L.padding, bw = L.kernel_w - 1 - L.padding;
  const int rows = L.out_h + 2 * bh, cols = L.out_w + 2 * bw, bplane = rows * cols;
  for (int i = b.tid; i < L.out_c * bplane; i += b.threads) {
    const int co = i / bplane, y = (i % bplane) / cols - bh, x = i % cols - bw;
    bordered[i] = y >= 0 && y < L.out_h && x >= 0 && x < L.out_w ? gy[co * plane + y * L.out_w + x] : 0.f;
  }
  for (int k = b.tid; k < kp; k += b.threads) {  // (co, ky, kx) -> its offset; -1: padding of K
    const int co = k / kk, ky = (k % kk) / L.kernel_w, kx = k % L.kernel_w;
    table[k] = k < K ? co * bplane + (L.kernel_h - 1 - ky) * cols + (L.kernel_w - 1 - kx) : -1;
  }
  __syncthreads();
  const int g = b.lane >> 2, t = b.lane & 3, tiles_n = round_up(N, 8) / 8, tiles = round_up(M, 16) / 16 * tiles_n;
  for (int tile = b.warp; tile < tiles; tile += b.warps) {
    const int m0 = tile / tiles_n * 16, n0 = tile % tiles_n * 8;
    int base[2];
    bool row_ok[2];
    for (int r = 0; r < 2; ++r) {
      const int m = m0 + g + 8 * r;
      row_ok[r] = m < M;
      base[r] = (m / L.in_w) * cols + m % L.in_w;
    }
    float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 2
    for (int k0 = 0; k0 < kp; k0 += 16) {
      float v[2][4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int off = table[k0 + column_of(t, j)];
#pragma unroll
        for (int r = 0; r < 2; ++r) v[r][j] = row_ok[r] && off >= 0 ? bordered[base[r] + off] : 0.f;
      }
      mma_staged(c, v, weights + (n0 + g) * ws + k0 + 2 * t);
    }
    for (int i = 0; i < 4; ++i) {
      const int m = c_row(m0, g, i), n = c_col(n0, t, i);
      if (m < M && n < N) g_in[n * M + m] = rounded(c[i]);
    }
  }
}

// Conv weight and bias gradients of one example, added to the block's slice.
// Where there are fewer tiles than warps, each tile's positions (K) are cut
// into parts whose sums `partial` holds until they are added in part order.
template <bool Padded>
__device__ void conv_weight_gradient(const Block& b, const CnnLayer& L, const float* gy, const float* in, int2* table,
                                     float* partial, float* dW, float* db, bool first) {
  const int kk = L.kernel_h * L.kernel_w, N = L.in_c * kk, M = L.out_c;
  const int K = L.out_h * L.out_w, kp = round_up(K, 16), in_plane = L.in_h * L.in_w;
  for (int k = b.tid; k < kp; k += b.threads)  // position -> its window's corner in the input
    table[k] = k < K ? make_int2((k / L.out_w) * L.stride - L.padding, (k % L.out_w) * L.stride - L.padding)
                     : make_int2(-(1 << 20), -(1 << 20));
  for (int co = b.warp; co < M; co += b.warps) {  // bias: a warp per channel
    float sum = 0.f;
    for (int k = b.lane; k < K; k += 32) sum += gy[co * K + k];
    sum = warp_sum(sum);
    if (b.lane == 0) accumulate(db + co, sum, first);
  }
  __syncthreads();
  const int g = b.lane >> 2, t = b.lane & 3, tiles_n = round_up(N, 8) / 8, tiles = round_up(M, 16) / 16 * tiles_n;
  const int steps = kp / 16, parts = max(1, min(steps, b.warps / tiles));
  for (int w = b.warp; w < tiles * parts; w += b.warps) {
    const int tile = w % tiles, part = w / tiles;
    const int m0 = tile / tiles_n * 16, n0 = tile % tiles_n * 8;
    const int n = n0 + g, tap = n % kk;  // this lane's B column: (ci, ky, kx)
    const bool col_ok = n < N;
    const int base = (n / kk) * in_plane, ky = tap / L.kernel_w, kx = tap % L.kernel_w;
    const int m_row[2] = {m0 + g, m0 + g + 8};
    float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 2
    for (int step = part * steps / parts; step < (part + 1) * steps / parts; ++step) {
      const int k0 = step * 16;
      float av[2][4], bv[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int k = k0 + column_of(t, j);
        const int2 e = table[k];
        const int iy = e.x + ky, ix = e.y + kx;
        bool ok = col_ok && k < K;
        if (Padded) ok = ok && iy >= 0 && iy < L.in_h && ix >= 0 && ix < L.in_w;
        bv[j] = ok ? in[base + iy * L.in_w + ix] : 0.f;
#pragma unroll
        for (int r = 0; r < 2; ++r) av[r][j] = m_row[r] < M && k < K ? gy[m_row[r] * K + k] : 0.f;
      }
      std::uint32_t a[4];
      a_fragment(av, a);
      mma_16x8x16(c, a, pack2(bv[0], bv[1]), pack2(bv[2], bv[3]));
    }
    if (parts == 1) {
      for (int i = 0; i < 4; ++i) {
        const int m = c_row(m0, g, i), nn = c_col(n0, t, i);
        if (m < M && nn < N) accumulate(dW + m * N + nn, c[i], first);
      }
    } else {
      for (int i = 0; i < 4; ++i) partial[((part * tiles + tile) * 32 + b.lane) * 4 + i] = c[i];
    }
  }
  if (parts == 1) return;
  __syncthreads();
  for (int i = b.tid; i < tiles * 128; i += b.threads) {
    const int tile = i / 128, lane = (i / 4) % 32, j = i % 4;
    float sum = 0.f;
    for (int part = 0; part < parts; ++part) sum += partial[((part * tiles + tile) * 32 + lane) * 4 + j];
    const int m = c_row(tile / tiles_n * 16, lane / 4, j), nn = c_col(tile % tiles_n * 8, lane % 4, j);
    if (m < M && nn < N) accumulate(dW + m * N + nn, sum, first);
  }
}

// ---- pooling, dropout, linear -------------------------------------------

// Index in its plane of the maximum of window (oy, ox): the first maximum in
// row-major order wins a tie and a NaN wins over numbers (ref::max_pool2d_argmax).
__device__ __forceinline__ int window_argmax(const float* plane, const CnnLayer& L, int oy, int ox) {
  int best = oy * L.stride * L.in_w + ox * L.stride;
  for (int i = 0; i < L.kernel_h; ++i)
    for (int j = 0; j < L.kernel_h; ++j) {
      const int at = (oy * L.stride + i) * L.in_w + ox * L.stride + j;
      if (plane[at] > plane[best] || (isnan(plane[at]) && !isnan(plane[best]))) best = at;
    }
  return best;
}

__device__ void max_pool_forward(const Block& b, const CnnLayer& L, const float* in, float* out) {
  const int plane = L.out_h * L.out_w;
  for (int i = b.tid; i < L.out_c * plane; i += b.threads) {
    const float* p = in + (i / plane) * L.in_h * L.in_w;
    out[i] = p[window_argmax(p, L, (i % plane) / L.out_w, (i % plane) % L.out_w)];
  }
}

// dX: each input element gets the gradients of the windows whose argmax it
// is. Windows that do not overlap (stride = kernel) scatter: zero dX, then
// each window writes its one element.
__device__ void max_pool_backward(const Block& b, const CnnLayer& L, const float* gy, const float* in, float* g_in) {
  const int in_plane = L.in_h * L.in_w, k = L.kernel_h, s = L.stride;
  if (k == s) {
    for (int i = b.tid; i < L.in_c * in_plane; i += b.threads) g_in[i] = 0.f;
    __syncthreads();
    const int plane = L.out_h * L.out_w;
    for (int i = b.tid; i < L.out_c * plane; i += b.threads) {
      const int c = i / plane, oy = (i % plane) / L.out_w, ox = (i % plane) % L.out_w;
      g_in[c * in_plane + window_argmax(in + c * in_plane, L, oy, ox)] = gy[i];
    }
    return;
  }
  for (int i = b.tid; i < L.in_c * in_plane; i += b.threads) {
    const int c = i / in_plane, at = i % in_plane, iy = at / L.in_w, ix = at % L.in_w;
    const float* p = in + c * in_plane;
    const int oy0 = iy < k ? 0 : (iy - k) / s + 1, ox0 = ix < k ? 0 : (ix - k) / s + 1;
    const int oy1 = min(L.out_h - 1, iy / s), ox1 = min(L.out_w - 1, ix / s);
    float sum = 0.f;
    for (int oy = oy0; oy <= oy1; ++oy)
      for (int ox = ox0; ox <= ox1; ++ox)
        if (window_argmax(p, L, oy, ox) == at) sum += gy[(c * L.out_h + oy) * L.out_w + ox];
    g_in[i] = rounded(sum);
  }
}

// The keep bit of element `i` of this example (dropout: per element of the
// [batch, features] tensor; dropout2d: per channel plane of [batch, C, H, W]).
__device__ __forceinline__ bool kept(const CnnLayer& L, int example, int i, std::int32_t step) {
  const int size = L.out_c * L.out_h * L.out_w;
  const std::int64_t element = L.op == CnnLayerOp::dropout
                                   ? std::int64_t(example) * size + i
                                   : std::int64_t(example) * L.out_c + i / (L.out_h * L.out_w);
  return philox::dropout_keep(L.dropout.seed, L.dropout.stream, step, element, L.dropout.threshold);
}

// out[j] = bias[j] + sum_i in[i] W[j][i]: a warp per output.
__device__ void linear_forward(const Block& b, const CnnLayer& L, const float* in, float* out, const __half* weights,
                               const float* bias) {
  const int n_in = L.in_c * L.in_h * L.in_w;
  for (int j = b.warp; j < L.out_c; j += b.warps) {
    float s = 0.f;
    for (int i = b.lane; i < n_in; i += 32) s += in[i] * __half2float(weights[j * n_in + i]);
    s = warp_sum(s);
    if (b.lane == 0) out[j] = rounded(s + bias[j]);
  }
}

__device__ void linear_backward(const Block& b, const CnnLayer& L, const float* gy, const float* in, float* g_in,
                                const __half* weights, float* dW, float* db, bool first) {
  const int n_in = L.in_c * L.in_h * L.in_w;
  for (int j = b.warp; j < L.out_c; j += b.warps)
    for (int i = b.lane; i < n_in; i += 32) accumulate(dW + j * n_in + i, gy[j] * in[i], first);
  for (int j = b.tid; j < L.out_c; j += b.threads) accumulate(db + j, gy[j], first);
  if (!L.input_gradient) return;
  for (int i = b.tid; i < n_in; i += b.threads) {
    float s = 0.f;
    for (int j = 0; j < L.out_c; ++j) s += gy[j] * __half2float(weights[j * n_in + i]);
    g_in[i] = rounded(s);
  }
}

// ---- kernel 1: one example per block at a time ----------------------------

__global__ void __launch_bounds__(kThreads, 1) cnn_step_examples(const CnnStepArgs a, const CnnStepLaunch l) {
  extern __shared__ float4 shared4[];
  Block b{reinterpret_cast<float*>(shared4), int(threadIdx.x), int(blockDim.x), int(threadIdx.x) / 32,
          int(threadIdx.x) % 32, int(blockDim.x) / 32};
  float* const smem = b.smem;
  auto* table = reinterpret_cast<int2*>(smem + l.table_offset);
  const auto weights = [&](int li) { return reinterpret_cast<const __half*>(smem + l.weight_offset[li]); };
  mark_phase(a.phase_clock, 0, true);
  stage_parameters(b, a, l);
  float* const partial = smem + l.reduce_offset;
  const std::int32_t step = *a.step;
  const std::int64_t slice = a.param_offset[a.tensors];
  float* const grads = a.workspace + blockIdx.x * slice;
  float* const example_loss = a.workspace + std::int64_t(gridDim.x) * slice;
  const CnnLayer& first_layer = a.layer[0];
  const int pixels = first_layer.in_c * first_layer.in_h * first_layer.in_w;
  const int classes = a.layer[a.layers - 1].out_c;

  for (int example = blockIdx.x; example < a.batch; example += gridDim.x) {
    const bool first = example == int(blockIdx.x);
    int phase = 1;
    mark_phase(a.phase_clock, phase++, first);
    // Fetch (as launch_batch_fetch: x * scale + shift, rounded to fp16).
    const std::int64_t row = a.perm[(std::int64_t(step) % (a.rows / a.batch)) * a.batch + example];
    const std::uint8_t* src = a.images + row * pixels;
    for (int i = b.tid; i < pixels; i += b.threads)
      smem[l.act_offset[0] + i] = rounded(float(src[i]) * a.scale + a.shift);
    const int label = a.labels[row];
    __syncthreads();
    mark_phase(a.phase_clock, phase++, first);

    for (int li = 0; li < a.layers; ++li) {
      const CnnLayer L = a.layer[li];  // a copy in registers: indexed kernel-parameter loads are slow
      const float* in = smem + l.act_offset[li];
      float* out = smem + l.act_offset[li + 1];
      const int n = L.out_c * L.out_h * L.out_w;
      switch (L.op) {
        case CnnLayerOp::conv2d:
          if (L.padding > 0) conv_forward<true>(b, L, in, out, weights(li), smem + l.bias_offset[li], table);
          else conv_forward<false>(b, L, in, out, weights(li), smem + l.bias_offset[li], table);
          break;
        case CnnLayerOp::max_pool2d: max_pool_forward(b, L, in, out); break;
        case CnnLayerOp::relu:
          for (int i = b.tid; i < n; i += b.threads) out[i] = in[i] > 0.f ? in[i] : 0.f;
          break;
        case CnnLayerOp::dropout:
          for (int i = b.tid; i < n; i += b.threads)
            out[i] = kept(L, example, i, step) ? rounded(in[i] * L.dropout.scale) : 0.f;
          break;
        case CnnLayerOp::dropout2d: {  // one draw per channel
          const int plane = L.out_h * L.out_w;
          for (int c = b.tid; c < L.out_c; c += b.threads) partial[c] = kept(L, example, c * plane, step) ? 1.f : 0.f;
          __syncthreads();
          for (int i = b.tid; i < n; i += b.threads)
            out[i] = partial[i / plane] != 0.f ? rounded(in[i] * L.dropout.scale) : 0.f;
          break;
        }
        case CnnLayerOp::linear: linear_forward(b, L, in, out, weights(li), smem + l.bias_offset[li]); break;
        case CnnLayerOp::view: break;  // same bytes (act_offset aliases them)
      }
      __syncthreads();
      if (L.op != CnnLayerOp::view) mark_phase(a.phase_clock, phase++, first);
    }

    // Softmax cross-entropy of the logits and their gradient (softmax - onehot) / batch.
    float* g = smem + l.grad_offset[0];
    if (b.warp == 0) {
      const float* z = smem + l.act_offset[a.layers];
      float mx = -INFINITY;
      for (int j = b.lane; j < classes; j += 32) mx = fmaxf(mx, z[j]);
      mx = warp_max(mx);
      float sum = 0.f;
      for (int j = b.lane; j < classes; j += 32) sum += expf(z[j] - mx);
      sum = warp_sum(sum);
      if (b.lane == 0) example_loss[example] = logf(sum) + mx - z[label];
      for (int j = b.lane; j < classes; j += 32)
        g[j] = rounded((expf(z[j] - mx) / sum - (j == label ? 1.f : 0.f)) / float(a.batch));
    }
    __syncthreads();
    mark_phase(a.phase_clock, phase++, first);

    int cur = 0;
    for (int li = a.layers; li-- > 0;) {
      const CnnLayer L = a.layer[li];  // a copy in registers: indexed kernel-parameter loads are slow
      if (L.op == CnnLayerOp::view) continue;  // the gradient's bytes are the input gradient's
      const float* in = smem + l.act_offset[li];
      const float* out = smem + l.act_offset[li + 1];
      g = smem + l.grad_offset[cur];
      float* g_in = smem + l.grad_offset[1 - cur];
      const int n = L.in_c * L.in_h * L.in_w;
      switch (L.op) {
        case CnnLayerOp::conv2d:
          if (L.padding > 0)
            conv_weight_gradient<true>(b, L, g, in, table, partial, grads + a.param_offset[L.weight],
                                       grads + a.param_offset[L.bias], first);
          else
            conv_weight_gradient<false>(b, L, g, in, table, partial, grads + a.param_offset[L.weight],
                                        grads + a.param_offset[L.bias], first);
          if (L.input_gradient) {
            __syncthreads();  // the weight gradient's table is still being read until here
            mark_phase(a.phase_clock, phase++, first);
            const auto* wt = reinterpret_cast<const __half*>(smem + l.weight_t_offset[li]);
            if (bordered_data_gradient(L))
              conv_data_gradient_bordered(b, L, g, smem + l.border_offset, g_in, wt, reinterpret_cast<int*>(table));
            else
              conv_data_gradient(b, L, g, g_in, wt, table);
          }
          break;
        case CnnLayerOp::linear:
          linear_backward(b, L, g, in, g_in, weights(li), grads + a.param_offset[L.weight],
                          grads + a.param_offset[L.bias], first);
          break;
        case CnnLayerOp::max_pool2d: max_pool_backward(b, L, g, in, g_in); break;
        case CnnLayerOp::relu:
          for (int i = b.tid; i < n; i += b.threads) g_in[i] = out[i] > 0.f ? g[i] : 0.f;
          break;
        case CnnLayerOp::dropout:
          for (int i = b.tid; i < n; i += b.threads)
            g_in[i] = kept(L, example, i, step) ? rounded(g[i] * L.dropout.scale) : 0.f;
          break;
        case CnnLayerOp::dropout2d: {
          const int plane = L.out_h * L.out_w;
          for (int c = b.tid; c < L.out_c; c += b.threads) partial[c] = kept(L, example, c * plane, step) ? 1.f : 0.f;
          __syncthreads();
          for (int i = b.tid; i < n; i += b.threads)
            g_in[i] = partial[i / plane] != 0.f ? rounded(g[i] * L.dropout.scale) : 0.f;
          break;
        }
        case CnnLayerOp::view: break;
      }
      __syncthreads();
      mark_phase(a.phase_clock, phase++, first);
      if ((L.op == CnnLayerOp::conv2d || L.op == CnnLayerOp::linear) && !L.input_gradient) break;
      cur = 1 - cur;
    }
  }
}

// ---- kernel 2: sum the blocks' gradients, update, loss, step --------------

__global__ void __launch_bounds__(kUpdateThreads) cnn_step_update(const CnnStepArgs a, int blocks, int phase) {
  mark_phase(a.phase_clock, phase, true);
  const std::int64_t slice = a.param_offset[a.tensors];
  for (std::int64_t e = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; e < slice;
       e += std::int64_t(gridDim.x) * blockDim.x) {
    int t = 0;
    while (e >= a.param_offset[t + 1]) ++t;
    float sum = 0.f;
    for (int k = 0; k < blocks; ++k) sum += a.workspace[k * slice + e];
    const std::int64_t i = e - a.param_offset[t];
    float* v = a.velocity[t] ? a.velocity[t] + i : nullptr;
    a.param[t][i] = sgd_step(a.param[t][i], rounded(sum), v, *a.sgd[t]);
  }
  if (blockIdx.x == 0 && threadIdx.x < 32) {
    const float* example_loss = a.workspace + std::int64_t(blocks) * slice;
    float sum = 0.f;
    for (int i = threadIdx.x; i < a.batch; i += 32) sum += example_loss[i];
    sum = warp_sum(sum);
    if (threadIdx.x == 0) {
      *a.loss = sum / float(a.batch);
      *a.step += 1;
    }
  }
  __syncthreads();
  mark_phase(a.phase_clock, phase + 1, true);
}

int align4(int floats) { return (floats + 3) / 4 * 4; }

struct SharedLayout {
  CnnStepLaunch launch;
  std::size_t bytes = 0;
};

SharedLayout shared_layout(const CnnStepArgs& a) {
  SharedLayout s;
  int at = 0;
  auto take = [&](int floats) {
    const int start = at;
    at += align4(floats);
    return start;
  };
  const CnnLayer& first = a.layer[0];
  s.launch.act_offset[0] = take(first.in_c * first.in_h * first.in_w);
  int grad = 0, table = 0;
  for (int i = 0; i < a.layers; ++i) {
    const CnnLayer& L = a.layer[i];
    const int in = L.in_c * L.in_h * L.in_w, out = L.out_c * L.out_h * L.out_w;
    s.launch.act_offset[i + 1] = L.op == CnnLayerOp::view ? s.launch.act_offset[i] : take(out);
    grad = std::max({grad, in, out});
    if (L.op == CnnLayerOp::conv2d) {  // the implicit GEMMs' index tables
      const int kk = L.kernel_h * L.kernel_w;
      table = std::max({table, round_up(L.in_c * kk, 16), round_up(L.out_c * kk, 16), round_up(L.out_h * L.out_w, 16)});
    }
  }
  s.launch.grad_offset[0] = take(grad);
  s.launch.grad_offset[1] = take(grad);
  // Every layer's fp16 weights (forward / linear layout, then a conv's data-gradient layout) and rounded biases.
  const int weights_start = at;
  for (int i = 0; i < a.layers; ++i) {
    const CnnLayer& L = a.layer[i];
    if (L.op == CnnLayerOp::conv2d) {
      s.launch.weight_offset[i] = take((round_up(L.out_c, 8) * forward_stride(L) + 1) / 2);
      if (L.input_gradient) s.launch.weight_t_offset[i] = take((round_up(L.in_c, 8) * data_stride(L) + 1) / 2);
    }
    if (L.op == CnnLayerOp::linear) s.launch.weight_offset[i] = take((L.out_c * L.in_c * L.in_h * L.in_w + 1) / 2);
    if (L.op == CnnLayerOp::conv2d || L.op == CnnLayerOp::linear) s.launch.bias_offset[i] = take(L.out_c);
  }
  s.launch.weights_offset = weights_start;
  s.launch.weights_floats = at - weights_start;
  s.launch.table_offset = take(2 * table);
  int border = 0, channels = 0;
  for (int i = 0; i < a.layers; ++i) {
    if (a.layer[i].op == CnnLayerOp::conv2d && bordered_data_gradient(a.layer[i]))
      border = std::max(border, bordered_size(a.layer[i]));
    if (a.layer[i].op == CnnLayerOp::dropout2d) channels = std::max(channels, a.layer[i].out_c);
  }
  s.launch.border_offset = take(border);
  // A 16 x 8 fp32 tile per warp (conv weight gradients), or a dropout2d layer's channel mask.
  s.launch.reduce_offset = take(std::max(kThreads / 32 * 128, channels));
  s.launch.threads = kThreads;
  s.bytes = std::size_t(at) * sizeof(float);
  s.launch.shared_bytes = s.bytes;
  return s;
}

int shared_limit() {
  int device = 0, limit = 0;
  SG_CUDA_CHECK(cudaGetDevice(&device));
  SG_CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return limit;
}

}  // namespace

std::string cnn_step_unsupported(const CnnStepArgs& a) {
  if (a.layers < 1 || a.layers > kCnnStepMaxLayers) return fmt::format("{} layers (1 to {})", a.layers, kCnnStepMaxLayers);
  if (a.tensors > kCnnStepMaxTensors) return fmt::format("{} parameter tensors (at most {})", a.tensors, kCnnStepMaxTensors);
  if (a.batch < 1 || a.rows < a.batch) return "fewer rows than a batch";
  const std::size_t bytes = shared_layout(a).bytes;
  if (bytes > std::size_t(shared_limit()))
    return fmt::format("an example's activations need {} bytes of shared memory (the GPU has {})", bytes,
                       shared_limit());
  return {};
}

CnnStepLaunch plan_cnn_step_launch(const CnnStepArgs& a) {
  const SharedLayout s = shared_layout(a);
  SG_CUDA_CHECK(cudaFuncSetAttribute(cnn_step_examples, cudaFuncAttributeMaxDynamicSharedMemorySize, int(s.bytes)));
  int device = 0, sms = 0, per_sm = 0;
  SG_CUDA_CHECK(cudaGetDevice(&device));
  SG_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  SG_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, cnn_step_examples, kThreads, s.bytes));
  // Every block resident at once, each taking the same number of examples.
  const int resident = std::max(1, sms * std::max(1, per_sm));
  const int per_block = (a.batch + resident - 1) / resident;
  CnnStepLaunch launch = s.launch;
  launch.blocks = (a.batch + per_block - 1) / per_block;
  return launch;
}

std::vector<std::string> cnn_step_phase_names(const CnnStepArgs& a) {
  static constexpr const char* kOps[] = {"conv2d", "max_pool2d", "relu", "dropout2d", "dropout", "view", "linear"};
  std::vector<std::string> names{"weights staged in shared memory (once per block)", "fetch (block 0, its first example)"};
  for (int i = 0; i < a.layers; ++i)
    if (a.layer[i].op != CnnLayerOp::view) names.push_back(fmt::format("forward layer {} {}", i, kOps[int(a.layer[i].op)]));
  names.push_back("softmax cross-entropy");
  for (int i = a.layers; i-- > 0;) {
    const CnnLayer& L = a.layer[i];
    if (L.op == CnnLayerOp::view) continue;
    if (L.op == CnnLayerOp::conv2d && L.input_gradient) {
      names.push_back(fmt::format("backward layer {} conv2d: weight and bias gradients", i));
      names.push_back(fmt::format("backward layer {} conv2d: input gradient", i));
      continue;
    }
    names.push_back(fmt::format("backward layer {} {}", i, kOps[int(L.op)]));
    if ((L.op == CnnLayerOp::conv2d || L.op == CnnLayerOp::linear) && !L.input_gradient) break;
  }
  names.push_back("other blocks and examples, then the update kernel's start");
  names.push_back("update kernel (its block 0)");
  return names;
}

std::size_t cnn_step_workspace_bytes(const CnnStepArgs& a, const CnnStepLaunch& l) {
  return (std::size_t(l.blocks) * std::size_t(a.param_offset[a.tensors]) + std::size_t(a.batch)) * sizeof(float);
}

void launch_cnn_step(const CnnStepArgs& a, const CnnStepLaunch& l, cudaStream_t stream) {
  cnn_step_examples<<<l.blocks, l.threads, l.shared_bytes, stream>>>(a, l);
  SG_LAUNCH_CHECK("cnn_step_examples");
  const std::int64_t slice = a.param_offset[a.tensors];
  const int update_blocks = int(std::max<std::int64_t>(1, (slice + kUpdateThreads - 1) / kUpdateThreads));
  cnn_step_update<<<update_blocks, kUpdateThreads, 0, stream>>>(a, l.blocks,
                                                                 static_cast<int>(cnn_step_phase_names(a).size()) - 1);
  SG_LAUNCH_CHECK("cnn_step_update");
}

}  // namespace sg::cuda
