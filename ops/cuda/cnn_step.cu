// The CNN training step in two kernels (cnn_step.hpp says why). Kernel 1
// reads top to bottom as one example's step: copy the arguments, the conv
// GEMMs' index tables and the parameter image (the weights as the layers
// read them) into shared memory (once per block), fetch, each layer's
// forward, the loss, each layer's backward in reverse, with a barrier
// between layers. Convolutions are implicit GEMMs on tensor cores whose
// operands are gathered from the activations through index tables and whose
// work is cut evenly over the warps; everything else is a plain loop over
// the layer's elements.
#include <cuda_fp16.h>

#include <fmt/format.h>

#include <algorithm>

#include "ops/cuda/cnn_step.hpp"
#include "ops/cuda/async_copy.cuh"
#include "ops/cuda/dependent_launch.cuh"
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

// `bytes` (a multiple of 4) from `src` to `dst`, a word per thread.
__device__ __forceinline__ void copy_words(const Block& b, const void* src, void* dst, std::size_t bytes) {
  const auto* from = static_cast<const std::uint32_t*>(src);
  auto* to = static_cast<std::uint32_t*>(dst);
  for (std::size_t i = b.tid; i < bytes / 4; i += b.threads) to[i] = from[i];
}

// ---- convolutions as block GEMMs on tensor cores ---------------------------
// Each convolution of an example is an implicit GEMM C[M][N] = sum_k A[m][k]
// B[k][n] (mma.m16n8k16: fp16 operands, which the graph's fp16 values are
// exactly, and fp32 sums), its A gathered from an activation in shared
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
// A lane's A registers from its values v[row r][j-th column].
__device__ __forceinline__ void a_fragment(const float (&v)[2][4], std::uint32_t (&a)[4]) {
  a[0] = pack2(v[0][0], v[0][1]);
  a[1] = pack2(v[1][0], v[1][1]);
  a[2] = pack2(v[0][2], v[0][3]);
  a[3] = pack2(v[1][2], v[1][3]);
}
// Where a lane's accumulator c[i] sits in C: row m0 + g + 8 (i / 2), column n0 + 2t + i % 2.
__device__ __forceinline__ int c_row(int m0, int g, int i) { return m0 + g + (i >> 1) * 8; }
__device__ __forceinline__ int c_col(int n0, int t, int i) { return n0 + 2 * t + (i & 1); }

// A warp takes a 16-row tile of C times kColumnTiles 8-column tiles, so one
// gathered A fragment feeds that many mma. One width for every GEMM keeps
// one copy of each GEMM's code: each runs once per example, so its code is
// fetched again every step (with a width per layer, 17% of kernel 1's
// stalls in ncu waited on instruction fetch), which cost more than the mma
// a narrow layer saves.
constexpr int kColumnTiles = 3;

// A row or column of a gather: x = offset in the source, y = the window
// corner or tap displacement as (dy << 16 | dx & 0xffff); kNoIndex marks a
// row or column past the GEMM's end (it reads 0).
constexpr int kNoIndex = int(0x80000000u);
__host__ __device__ inline int2 patch_index(int offset, int dy, int dx) {
  return make_int2(offset, int((unsigned(dy) << 16) | (unsigned(dx) & 0xffffu)));
}
__host__ __device__ inline int2 no_patch_index() { return make_int2(0, kNoIndex); }
__device__ __forceinline__ int index_dy(int yx) { return yx >> 16; }
__device__ __forceinline__ int index_dx(int yx) { return static_cast<short>(yx & 0xffff); }

// Window `p` of a convolution (row-major over its output) and tap `k` (ci, ky, kx) of its kernel.
__host__ __device__ inline int2 window_index(const CnnLayer& L, int p) {
  const int y = (p / L.out_w) * L.stride - L.padding, x = (p % L.out_w) * L.stride - L.padding;
  return patch_index(y * L.in_w + x, y, x);
}
__host__ __device__ inline int2 tap_index(const CnnLayer& L, int k) {
  const int kk = L.kernel_h * L.kernel_w, ci = k / kk, ky = (k % kk) / L.kernel_w, kx = k % L.kernel_w;
  return patch_index(ci * L.in_h * L.in_w + ky * L.in_w + kx, ky, kx);
}

template <bool Padded>
__device__ __forceinline__ float gather(const float* src, int h, int w, int2 row, int2 column) {
  if (Padded) {  // kNoIndex's dy (-32768) fails the bounds check too
    const int y = index_dy(row.y) + index_dy(column.y), x = index_dx(row.y) + index_dx(column.y);
    return y >= 0 && y < h && x >= 0 && x < w ? src[row.x + column.x] : 0.f;
  }
  return row.y != kNoIndex && column.y != kNoIndex ? src[row.x + column.x] : 0.f;
}

// B from staged fp16 rows: column n of B is row n, its k contiguous with
// zeros past K. Columns past N give C columns that are never stored, so they
// read the last row again instead of rows of zeros.
struct StagedRows {
  const __half* w;
  int stride, last_row;
  __device__ __forceinline__ void operator()(int n, int k, std::uint32_t& b0, std::uint32_t& b1) const {
    const __half* p = w + min(n, last_row) * stride + k;
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
template <int NT, bool Padded, class BOf, class Store>
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
      a_fragment(v, a);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        std::uint32_t b0, b1;
        b_of(n0 + 8 * nt + g, k0 + 2 * t, b0, b1);
        mma_16x8x16(c[nt], a, b0, b1);
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
// Row stride of a conv layer's dY^T staged as fp16 rows [co][pos] (its weight gradient's B).
__host__ __device__ inline int dy_stride(const CnnLayer& L) { return round_up(L.out_h * L.out_w, 16) + 8; }
// The data gradient's dY copy: dilated by the stride, with a border of
// kernel - 1 - padding, (in_h + kernel_h - 1) x (in_w + kernel_w - 1) per channel.
__host__ __device__ inline int bordered_size(const CnnLayer& L) {
  return L.out_c * (L.in_h + L.kernel_h - 1) * (L.in_w + L.kernel_w - 1);
}
__host__ __device__ inline bool has_parameters(const CnnLayer& L) {
  return L.op == CnnLayerOp::conv2d || L.op == CnnLayerOp::linear;
}
// Whether layer li (pooling or linear) also applies the ReLU layer after it,
// which then runs no phase of its own (one barrier and pass fewer each way).
inline bool relu_fused_into(const CnnStepArgs& a, int li) {
  return li + 1 < a.layers && a.layer[li + 1].op == CnnLayerOp::relu &&
         (a.layer[li].op == CnnLayerOp::max_pool2d || a.layer[li].op == CnnLayerOp::linear);
}
inline bool fused_relu(const CnnStepArgs& a, int li) {
  return li > 0 && a.layer[li].op == CnnLayerOp::relu && relu_fused_into(a, li - 1);
}

// `count` floats from global to shared memory, asynchronously (cp.async):
// 16 bytes a copy where the source is aligned so (`dst` always is).
__device__ void copy_to_shared(const Block& b, const float* src, int count, float* dst) {
  const int vectors = reinterpret_cast<std::uintptr_t>(src) % 16 == 0 ? count / 4 : 0;
  for (int q = b.tid; q < vectors; q += b.threads) copy_async16(shared_address(dst + 4 * q), src + 4 * q);
  for (int i = 4 * vectors + b.tid; i < count; i += b.threads) copy_async4(shared_address(dst + i), src + i);
}

// Part `p` of the parameter image (CnnStepLaunch::part_start) into its place
// in shared memory, as one group of asynchronous copies: once per block,
// kernel 1 updates no parameter. Parts arrive in order; layer_ready waits
// for those up to a layer's.
__device__ void copy_image_part(const Block& b, const CnnStepArgs& a, const CnnStepLaunch& l, int p) {
  const int start = p == 0 ? 0 : l.part_start[p - 1], end = p == kImageParts - 1 ? l.image_floats : l.part_start[p];
  copy_to_shared(b, a.image + start, end - start, b.smem + l.image_offset + start);
  if (p == 0) copy_to_shared(b, a.index_tables, l.tables_floats, b.smem + l.tables_offset);  // the first GEMM's too
  commit_copies();
}
// Before layer li of the first example: where it opens part 1 or 2 of the
// image, that part's copies (and those before) have landed, for every thread.
__device__ void layer_ready(const CnnStepLaunch& l, int li) {
  if (li == l.part_layer[1]) {  // (part 1 may be empty and open here too)
    wait_copies<0>();
    __syncthreads();
  } else if (li == l.part_layer[0]) {
    wait_copies<1>();
    __syncthreads();
  }
}

// Where tensor t's elements sit in the parameter image: element i of a conv
// weight [co][ci][tap] (a linear one [out][in], as one tap) at half
// forward + co * forward_stride + (ci, tap), and where the layer computes
// its input gradient also at half data + ci * data_stride + co * taps + tap;
// a bias element at float bias + i. Offsets from the image's start.
struct ImageTarget {
  int forward = -1, data = -1, bias = -1;
  int row = 1, taps = 1, forward_stride = 0, data_stride = 0;
};

__host__ __device__ inline ImageTarget image_target(const CnnStepArgs& a, const CnnStepLaunch& l, int t) {
  ImageTarget x;
  for (int li = 0; li < a.layers; ++li) {
    const CnnLayer& L = a.layer[li];
    if (!has_parameters(L)) continue;
    if (L.bias == t) x.bias = l.bias_offset[li] - l.image_offset;
    if (L.weight != t) continue;
    const bool conv = L.op == CnnLayerOp::conv2d;
    x.row = conv ? L.in_c * L.kernel_h * L.kernel_w : L.in_c * L.in_h * L.in_w;
    x.taps = conv ? L.kernel_h * L.kernel_w : 1;
    x.forward = 2 * (l.weight_offset[li] - l.image_offset);
    x.forward_stride = conv ? forward_stride(L) : x.row;
    if (conv && L.input_gradient) {
      x.data = 2 * (l.weight_t_offset[li] - l.image_offset);
      x.data_stride = data_stride(L);
    }
  }
  return x;
}

// Element i of a tensor, `value` (its fp32 master), into the image as the
// graph's cast makes it: fp16 weights, biases rounded to fp16 values.
__device__ __forceinline__ void store_in_image(float* image, const ImageTarget& x, int i, float value) {
  if (x.bias >= 0) {
    image[x.bias + i] = rounded(value);
    return;
  }
  auto* h = reinterpret_cast<__half*>(image);
  const __half v = __float2half_rn(value);
  const int co = i / x.row, r = i - co * x.row;
  h[x.forward + co * x.forward_stride + r] = v;
  if (x.data >= 0) {
    const int ci = r / x.taps, tap = r - ci * x.taps;
    h[x.data + ci * x.data_stride + co * x.taps + tap] = v;
  }
}

template <bool Padded>
__device__ void conv_forward(const Block& b, const CnnLayer& L, const float* in, float* out, const __half* weights,
                             const float* bias, const int2* windows, const int2* taps, float* slots) {
  const int K = L.in_c * L.kernel_h * L.kernel_w, N = L.out_c, M = L.out_h * L.out_w;
  block_gemm<kColumnTiles, Padded>(b, M, N, K, in, L.in_h, L.in_w, windows, taps, StagedRows{weights, forward_stride(L), N - 1},
                    [&](int m, int n, float c) { out[n * M + m] = rounded(c + bias[n]); }, slots);
}

// Conv weight and bias gradients of one example, added to the block's slice.
// dY^T, B of the GEMM, is first staged as fp16 rows [co][pos] in `scratch`.
template <bool Padded>
__device__ void conv_weight_gradient(const Block& b, const CnnLayer& L, const float* gy, const float* in,
                                     const int2* windows, const int2* taps, float* scratch, float* slots, float* dW,
                                     float* db, bool first) {
  const int M = L.in_c * L.kernel_h * L.kernel_w, N = L.out_c, K = L.out_h * L.out_w, ks = dy_stride(L);
  __half* dy = reinterpret_cast<__half*>(scratch);
  for (int co = b.warp; co < N; co += b.warps)  // zeros past K
    for (int k = b.lane; k < ks; k += 32) dy[co * ks + k] = __float2half_rn(k < K ? gy[co * K + k] : 0.f);
  for (int co = b.warp; co < N; co += b.warps) {  // bias: a warp per channel
    float sum = 0.f;
    for (int k = b.lane; k < K; k += 32) sum += gy[co * K + k];
    sum = warp_sum(sum);
    if (b.lane == 0) accumulate(db + co, sum, first);
  }
  __syncthreads();
  block_gemm<kColumnTiles, Padded>(b, M, N, K, in, L.in_h, L.in_w, taps, windows, StagedRows{dy, ks, N - 1},
                    [&](int m, int n, float c) { accumulate(dW + n * M + m, c, first); }, slots);
}

// The data gradient: a correlation of dY, dilated by the stride and with a
// zero border, with the flipped kernel; no operand needs a check. The
// layer's copy `bordered` keeps the zeros kernel 1 writes once per block: each
// example writes only dY's elements into it.
__device__ void conv_data_gradient(const Block& b, const CnnLayer& L, const float* gy, float* bordered, float* g_in,
                                   const __half* weights, const int2* rows, const int2* columns, float* slots) {
  const int kk = L.kernel_h * L.kernel_w, K = L.out_c * kk, N = L.in_c, M = L.in_h * L.in_w;
  const int bh = L.kernel_h - 1 - L.padding, bw = L.kernel_w - 1 - L.padding;
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
  block_gemm<kColumnTiles, false>(b, M, N, K, bordered, 0, 0, rows, columns, StagedRows{weights, data_stride(L), N - 1},
                   [&](int m, int n, float c) { g_in[n * M + m] = rounded(c); }, slots);
}

// ---- pooling, dropout, linear -------------------------------------------

// Index in its plane of the maximum of window (oy, ox): the first maximum in
// row-major order wins a tie and a NaN wins over numbers (ref::max_pool2d_argmax).
__device__ __forceinline__ int window_argmax(const float* plane, const CnnLayer& L, int oy, int ox) {
  const int corner = oy * L.stride * L.in_w + ox * L.stride;
  int best = corner;
  float top = plane[best];
  for (int i = 0; i < L.kernel_h; ++i)
    for (int j = 0; j < L.kernel_h; ++j) {
      const int at = corner + i * L.in_w + j;
      const float v = plane[at];
      if (top == top && !(v <= top)) {  // top a number, v above it or NaN
        best = at;
        top = v;
      }
    }
  return best;
}

// A ReLU right after a pooling or linear layer runs inside it
// (CnnStepLaunch::relu): the forward writes the ReLU's output, and the backward
// takes the ReLU's output gradient through the ReLU as it reads it.
__device__ __forceinline__ float relu(float x) { return x > 0.f ? x : 0.f; }
__device__ __forceinline__ float through_relu(const float* relu_out, const float* g, int i) {
  return relu_out && !(relu_out[i] > 0.f) ? 0.f : g[i];
}

__device__ void max_pool_forward(const Block& b, const CnnLayer& L, const float* in, float* out, bool with_relu) {
  const int plane = L.out_h * L.out_w;
  for (int i = b.tid; i < L.out_c * plane; i += b.threads) {
    const float* p = in + (i / plane) * L.in_h * L.in_w;
    const float v = p[window_argmax(p, L, (i % plane) / L.out_w, (i % plane) % L.out_w)];
    out[i] = with_relu ? relu(v) : v;
  }
}

// dX: each input element gets the gradients of the windows whose argmax it
// is. Windows that do not overlap (stride = kernel) scatter: zero dX, then
// each window writes its one element.
__device__ void max_pool_backward(const Block& b, const CnnLayer& L, const float* gy, const float* in, float* g_in,
                                  const float* relu_out) {
  const int in_plane = L.in_h * L.in_w, k = L.kernel_h, s = L.stride;
  if (k == s) {
    for (int i = b.tid; i < L.in_c * in_plane; i += b.threads) g_in[i] = 0.f;
    __syncthreads();
    const int plane = L.out_h * L.out_w;
    for (int i = b.tid; i < L.out_c * plane; i += b.threads) {
      const int c = i / plane, oy = (i % plane) / L.out_w, ox = (i % plane) % L.out_w;
      g_in[c * in_plane + window_argmax(in + c * in_plane, L, oy, ox)] = through_relu(relu_out, gy, i);
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
        if (window_argmax(p, L, oy, ox) == at) sum += through_relu(relu_out, gy, (c * L.out_h + oy) * L.out_w + ox);
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
                               const float* bias, bool with_relu) {
  const int n_in = L.in_c * L.in_h * L.in_w;
  for (int j = b.warp; j < L.out_c; j += b.warps) {
    float s = 0.f;
    for (int i = b.lane; i < n_in; i += 32) s += in[i] * __half2float(weights[j * n_in + i]);
    s = warp_sum(s);
    if (b.lane == 0) out[j] = with_relu ? relu(rounded(s + bias[j])) : rounded(s + bias[j]);
  }
}

// The example's weight gradient is the outer product dZ x^T. With one
// example per block its two factors go to the example's row of the workspace
// (`factors`: dZ, then x) and the update kernel sums the products over the
// batch; with several, the block adds the product to its slice (dW, db), so
// the update kernel reads one sum per block instead of one pair per example.
__device__ void linear_backward(const Block& b, const CnnLayer& L, const float* gy, const float* in, float* g_in,
                                const __half* weights, float* factors, float* dW, float* db, bool first,
                                const float* relu_out, float* masked) {
  const int n_in = L.in_c * L.in_h * L.in_w;
  if (relu_out) {  // the gradient through the ReLU once, for the loops below
    for (int j = b.tid; j < L.out_c; j += b.threads) masked[j] = through_relu(relu_out, gy, j);
    __syncthreads();
    gy = masked;
  }
  if (factors) {
    for (int j = b.tid; j < L.out_c; j += b.threads) factors[j] = gy[j];
    for (int i = b.tid; i < n_in; i += b.threads) factors[L.out_c + i] = in[i];
  } else {
    for (int j = b.warp; j < L.out_c; j += b.warps)
      for (int i = b.lane; i < n_in; i += 32) accumulate(dW + j * n_in + i, gy[j] * in[i], first);
    for (int j = b.tid; j < L.out_c; j += b.threads) accumulate(db + j, gy[j], first);
  }
  if (!L.input_gradient) return;
  for (int i = b.tid; i < n_in; i += b.threads) {
    float even = 0.f, odd = 0.f;  // two chains of adds in flight
    int j = 0;
    for (; j + 1 < L.out_c; j += 2) {
      even += gy[j] * __half2float(weights[j * n_in + i]);
      odd += gy[j + 1] * __half2float(weights[(j + 1) * n_in + i]);
    }
    if (j < L.out_c) even += gy[j] * __half2float(weights[j * n_in + i]);
    g_in[i] = rounded(even + odd);
  }
}

// The workspace (cnn_step_workspace_bytes), for a kernel 1 grid of
// `blocks`: the blocks' gradient slices, then the examples' factor rows,
// then the examples' losses.
__device__ __forceinline__ float* factor_rows(const CnnStepArgs& a, const CnnStepLaunch& l, int blocks) {
  return a.workspace + std::int64_t(blocks) * l.slice_floats;
}
__device__ __forceinline__ float* example_losses(const CnnStepArgs& a, const CnnStepLaunch& l, int blocks) {
  return factor_rows(a, l, blocks) + std::int64_t(a.batch) * l.factor_floats;
}

// ---- kernel 1: one example per block at a time ----------------------------

// One example's fetch (as launch_batch_fetch: x * scale + shift, rounded to
// fp16) into the input's place in shared memory; returns its label. The
// caller's barrier publishes the pixels.
__device__ int fetch_example(const Block& b, const CnnStepArgs& a, const CnnStepLaunch& l, std::int32_t step,
                             int example) {
  const CnnLayer& first = a.layer[0];
  const int pixels = first.in_c * first.in_h * first.in_w;
  const std::int64_t row = a.perm[(std::int64_t(step) % (a.rows / a.batch)) * a.batch + example];
  const std::uint8_t* src = a.images + row * pixels;
  for (int i = b.tid; i < pixels; i += b.threads) b.smem[l.act_offset[0] + i] = rounded(float(src[i]) * a.scale + a.shift);
  return a.labels[row];
}

// The arguments as copied into shared memory at the start: read by every
// warp in every layer with indices known only at run time, which are slow
// loads from the kernel parameters' constant bank.
struct SharedArguments {
  CnnStepArgs args;
  CnnStepLaunch launch;
};

__global__ void __launch_bounds__(kThreads, 1)
    cnn_step_examples(const __grid_constant__ CnnStepArgs args, const __grid_constant__ CnnStepLaunch launch) {
  extern __shared__ float4 shared4[];
  __shared__ SharedArguments arguments;
  Block b{reinterpret_cast<float*>(shared4), int(threadIdx.x), int(blockDim.x), int(threadIdx.x) / 32,
          int(threadIdx.x) % 32, int(blockDim.x) / 32};
  mark_phase(args.phase_clock, 0, true);
  allow_next_kernel_to_start();  // the update kernel's blocks wait on the free SMs (cnn_step_update)
  // The first layer's part of the image, the arguments, the first example's
  // fetch, then the rest of the image: the fetch is three loads in turn (step
  // counter, permutation, pixels), each waiting behind every copy issued before
  // it, and the rest of the image arrives while the first layers run. Until
  // the barrier below, the kernel parameters are read as the arguments' copy
  // and otherwise only in fields every thread reads alike.
  copy_image_part(b, args, launch, 0);
  constexpr std::size_t kLayersAt = offsetof(CnnStepArgs, layer), kAfterLayers = offsetof(CnnStepArgs, tensors);
  copy_words(b, &args, &arguments.args, kLayersAt + std::size_t(args.layers) * sizeof(CnnLayer));
  copy_words(b, reinterpret_cast<const char*>(&args) + kAfterLayers,
             reinterpret_cast<char*>(&arguments.args) + kAfterLayers, sizeof(CnnStepArgs) - kAfterLayers);
  copy_words(b, &launch, &arguments.launch, sizeof(CnnStepLaunch));
  const std::int32_t step = *args.step;
  int label = fetch_example(b, args, launch, step, blockIdx.x);
  for (int p = 1; p < kImageParts; ++p) copy_image_part(b, args, launch, p);
  for (int i = b.tid; i < launch.zeroed_floats; i += b.threads) b.smem[launch.zeroed_offset + i] = 0.f;
  static_assert(kImageParts == 3, "the waits below and in layer_ready count three groups");
  wait_copies<2>();
  __syncthreads();
  mark_phase(args.phase_clock, 1, true);
  const CnnStepArgs& a = arguments.args;
  const CnnStepLaunch& l = arguments.launch;
  float* const smem = b.smem;
  const auto table = [&](int offset) { return reinterpret_cast<const int2*>(smem + offset); };
  const auto weights = [&](int li) { return reinterpret_cast<const __half*>(smem + l.weight_offset[li]); };
  const auto keep_mask = [&](int li) { return reinterpret_cast<bool*>(smem + l.mask_offset[li]); };
  float* const slots = smem + l.reduce_offset;  // the conv GEMMs' slots; a linear layer's gradient through its ReLU
  float* const grads = a.workspace + std::int64_t(blockIdx.x) * l.slice_floats;  // this block's slice
  float* const factors = factor_rows(a, l, gridDim.x);
  float* const example_loss = example_losses(a, l, gridDim.x);
  const int classes = a.layer[a.layers - 1].out_c;

  for (int example = blockIdx.x; example < a.batch; example += gridDim.x) {
    const bool first = example == int(blockIdx.x);
    int phase = 2;
    if (!first) {  // (the first was fetched with the arguments)
      label = fetch_example(b, a, l, step, example);
      __syncthreads();
    }

    for (int li = 0; li < a.layers; ++li) {
      if (first) layer_ready(l, li);
      if (l.relu[li] == kReluRunByLayerBefore) continue;  // the layer before ran it
      const CnnLayer L = a.layer[li];  // a copy in registers
      const bool with_relu = l.relu[li] == kReluAfter;
      const float* in = smem + l.act_offset[li];
      float* out = smem + l.act_offset[li + (with_relu ? 2 : 1)];
      const int n = L.out_c * L.out_h * L.out_w;
      switch (L.op) {
        case CnnLayerOp::conv2d:
          if (L.padding > 0)
            conv_forward<true>(b, L, in, out, weights(li), smem + l.bias_offset[li], table(l.windows_offset[li]),
                               table(l.taps_offset[li]), slots);
          else
            conv_forward<false>(b, L, in, out, weights(li), smem + l.bias_offset[li], table(l.windows_offset[li]),
                                table(l.taps_offset[li]), slots);
          break;
        case CnnLayerOp::max_pool2d: max_pool_forward(b, L, in, out, with_relu); break;
        case CnnLayerOp::relu:
          for (int i = b.tid; i < n; i += b.threads) out[i] = in[i] > 0.f ? in[i] : 0.f;
          break;
        case CnnLayerOp::dropout:  // the keep bits stay for the backward (keep_mask)
          for (int i = b.tid; i < n; i += b.threads) {
            const bool keep = kept(L, example, i, step);
            keep_mask(li)[i] = keep;
            out[i] = keep ? rounded(in[i] * L.dropout.scale) : 0.f;
          }
          break;
        case CnnLayerOp::dropout2d: {  // one draw per channel
          const int plane = L.out_h * L.out_w;
          for (int c = b.tid; c < L.out_c; c += b.threads) keep_mask(li)[c] = kept(L, example, c * plane, step);
          __syncthreads();
          for (int i = b.tid; i < n; i += b.threads)
            out[i] = keep_mask(li)[i / plane] ? rounded(in[i] * L.dropout.scale) : 0.f;
          break;
        }
        case CnnLayerOp::linear: linear_forward(b, L, in, out, weights(li), smem + l.bias_offset[li], with_relu); break;
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
      const CnnLayer L = a.layer[li];  // a copy in registers
      if (L.op == CnnLayerOp::view) continue;  // the gradient's bytes are the input gradient's
      if (l.relu[li] == kReluRunByLayerBefore) continue;  // the layer before takes the gradient through it
      const float* relu_out = l.relu[li] == kReluAfter ? smem + l.act_offset[li + 2] : nullptr;
      const float* in = smem + l.act_offset[li];
      const float* out = smem + l.act_offset[li + 1];
      g = smem + l.grad_offset[cur];
      float* g_in = smem + l.grad_offset[1 - cur];
      const int n = L.in_c * L.in_h * L.in_w;
      switch (L.op) {
        case CnnLayerOp::conv2d:
        {
          // dY^T's fp16 rows: in the input gradient's buffer until that is written, where they fit
          float* const scratch = l.dy_offset < 0 ? g_in : smem + l.dy_offset;
          float* const dW = grads + l.slice_offset[L.weight];
          float* const db = grads + l.slice_offset[L.bias];
          const int2* windows = table(l.windows_offset[li]);
          const int2* taps = table(l.taps_offset[li]);
          if (L.padding > 0) conv_weight_gradient<true>(b, L, g, in, windows, taps, scratch, slots, dW, db, first);
          else conv_weight_gradient<false>(b, L, g, in, windows, taps, scratch, slots, dW, db, first);
          if (L.input_gradient) {
            __syncthreads();  // the weight gradient reads its tables and scratch until here
            mark_phase(a.phase_clock, phase++, first);
            const auto* wt = reinterpret_cast<const __half*>(smem + l.weight_t_offset[li]);
            conv_data_gradient(b, L, g, smem + l.border_offset[li], g_in, wt, table(l.data_rows_offset[li]),
                               table(l.data_columns_offset[li]), slots);
          }
        }
          break;
        case CnnLayerOp::linear: {
          const bool factored = l.factor_offset[li] >= 0;  // else its tensors are in the block's slice
          linear_backward(b, L, g, in, g_in, weights(li),
                          factored ? factors + std::int64_t(example) * l.factor_floats + l.factor_offset[li] : nullptr,
                          factored ? nullptr : grads + l.slice_offset[L.weight],
                          factored ? nullptr : grads + l.slice_offset[L.bias], first, relu_out, slots);
          break;
        }
        case CnnLayerOp::max_pool2d: max_pool_backward(b, L, g, in, g_in, relu_out); break;
        case CnnLayerOp::relu:
          for (int i = b.tid; i < n; i += b.threads) g_in[i] = out[i] > 0.f ? g[i] : 0.f;
          break;
        case CnnLayerOp::dropout:
          for (int i = b.tid; i < n; i += b.threads) g_in[i] = keep_mask(li)[i] ? rounded(g[i] * L.dropout.scale) : 0.f;
          break;
        case CnnLayerOp::dropout2d: {
          const int plane = L.out_h * L.out_w;
          for (int i = b.tid; i < n; i += b.threads)
            g_in[i] = keep_mask(li)[i / plane] ? rounded(g[i] * L.dropout.scale) : 0.f;
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

// kSumParts lanes per parameter element, each summing a contiguous part of
// the blocks' slices (or of the examples' factor products) with all its
// loads in flight, so the sum is one round trip to L2 instead of one per few
// loads (3.9 us of a 56 us step at batch 64, with one lane summing all 64
// slices eight loads at a time).
constexpr int kSumParts = 4;
static_assert(kSumParts == 4, "cnn_step_update's two shuffles add four parts");

// Where tensor t's gradient comes from (CnnStepLaunch): a conv tensor's
// element i from i + `slice` of every block's slice; a linear weight's
// element (j, c) of its `row`-wide rows from the sum over the examples of
// dZ[j] x[c], with dZ at `factor` of an example's factor row and x at
// factor + input_at; a linear bias's element j from the sum of dZ[j] (row 0).
struct GradientSource {
  int slice = -1, factor = -1, input_at = 0, row = 0;
};

inline __host__ __device__ GradientSource gradient_source(const CnnStepArgs& a, const CnnStepLaunch& l, int t) {
  GradientSource x;
  x.slice = l.slice_offset[t];
  if (x.slice >= 0) return x;
  for (int li = 0; li < a.layers; ++li) {
    const CnnLayer& L = a.layer[li];
    if (L.op != CnnLayerOp::linear || (L.weight != t && L.bias != t)) continue;
    x.factor = l.factor_offset[li];
    if (L.weight == t) {
      x.input_at = L.out_c;
      x.row = L.in_c * L.in_h * L.in_w;
    }
  }
  return x;
}

// Element i's part of its batch gradient: slices or examples [k0, k1).
__device__ __forceinline__ float gradient_part(const CnnStepArgs& a, const CnnStepLaunch& l, const GradientSource& x,
                                               int blocks, int i, int k0, int k1) {
  float sum = 0.f;
  if (x.slice >= 0) {
    const float* g = a.workspace + std::int64_t(k0) * l.slice_floats + x.slice + i;
#pragma unroll 16
    for (int k = k0; k < k1; ++k, g += l.slice_floats) sum += *g;
    return sum;
  }
  const float* f = a.workspace + std::int64_t(blocks) * l.slice_floats + std::int64_t(k0) * l.factor_floats + x.factor;
  if (x.row == 0) {
#pragma unroll 16
    for (int k = k0; k < k1; ++k, f += l.factor_floats) sum += f[i];
    return sum;
  }
  const int j = i / x.row, c = x.input_at + i - j * x.row;
#pragma unroll 16
  for (int k = k0; k < k1; ++k, f += l.factor_floats) sum += f[j] * f[c];
  return sum;
}

// The tensors' pointers, ranges, gradient sources and image targets in
// shared memory, once per block: indexing the kernel parameters' arrays per
// element is slow.
struct TensorTable {
  std::int64_t offset[kCnnStepMaxTensors + 1];
  float* param[kCnnStepMaxTensors];
  float* velocity[kCnnStepMaxTensors];
  const SgdScalars* sgd[kCnnStepMaxTensors];
  GradientSource source[kCnnStepMaxTensors];
  ImageTarget target[kCnnStepMaxTensors];
  __device__ int tensor_of(std::int64_t e) const {
    int t = 0;
    while (e >= offset[t + 1]) ++t;
    return t;
  }
};

__device__ void load_tensor_table(TensorTable& table, const CnnStepArgs& a, const CnnStepLaunch& l) {
  for (int t = threadIdx.x; t <= a.tensors; t += blockDim.x) {
    table.offset[t] = a.param_offset[t];
    if (t < a.tensors) {
      table.param[t] = a.param[t];
      table.velocity[t] = a.velocity[t];
      table.sgd[t] = a.sgd[t];
      table.source[t] = gradient_source(a, l, t);
      table.target[t] = image_target(a, l, t);
    }
  }
  __syncthreads();
}

// Launched as a dependent of kernel 1 (where the backend allows it), so its
// blocks are resident and have read what kernel 1 does not write (weights,
// velocities, SGD scalars, the step counter) when kernel 1 ends: after that
// an element costs one round of loads, its gradient's parts, all in flight.
// The grid has one lane per part of every element (element_blocks), and one
// block more, the last, for the batch's mean loss and the step advance.
__global__ void __launch_bounds__(kUpdateThreads)
    cnn_step_update(const __grid_constant__ CnnStepArgs a, const __grid_constant__ CnnStepLaunch l, int blocks,
                    int phase) {
  if (blockIdx.x == gridDim.x - 1) {
    if (threadIdx.x >= 32) return;
    const std::int32_t step = *a.step;  // written only by the previous step's update
    wait_for_previous_kernel();
    const float* example_loss = example_losses(a, l, blocks);
    float sum = 0.f;
    for (int i = threadIdx.x; i < a.batch; i += 32) sum += example_loss[i];
    sum = warp_sum(sum);
    if (threadIdx.x == 0) {
      *a.loss = sum / float(a.batch);
      *a.step = step + 1;
    }
    return;
  }
  __shared__ TensorTable table;
  load_tensor_table(table, a, l);
  const std::int64_t elements = table.offset[a.tensors];
  const int part = threadIdx.x % kSumParts;
  const std::int64_t e = (blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x) / kSumParts;
  const int t = e < elements ? table.tensor_of(e) : 0;
  const int i = int(e - table.offset[t]);
  const bool updates = part == 0 && e < elements;  // the lane that updates element e
  float* const velocity = table.velocity[t];
  float w = 0.f, v = 0.f;
  SgdScalars scalars{};
  if (updates) {
    w = table.param[t][i];
    if (velocity) v = velocity[i];
    scalars = *table.sgd[t];
  }
  wait_for_previous_kernel();
  mark_phase(a.phase_clock, phase, true);
  const GradientSource& source = table.source[t];
  const int parts_of = source.slice >= 0 ? blocks : a.batch;  // slices or examples
  const float part_sum = e < elements ? gradient_part(a, l, source, blocks, i, part * parts_of / kSumParts,
                                                      (part + 1) * parts_of / kSumParts)
                                      : 0.f;
  // The parts' sums in one order for every element: (p0 + p1) + (p2 + p3).
  float sum = part_sum + __shfl_xor_sync(0xffffffffu, part_sum, 1);
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  if (updates) {
    w = sgd_step(w, rounded(sum), velocity != nullptr, v, scalars);
    table.param[t][i] = w;
    if (velocity) velocity[i] = v;
    store_in_image(a.image, table.target[t], i, w);
  }
  __syncthreads();
  mark_phase(a.phase_clock, phase + 1, true);
}

// The parameter image from the fp32 parameters (launch_cnn_step_image).
__global__ void __launch_bounds__(kUpdateThreads)
    cnn_step_build_image(const __grid_constant__ CnnStepArgs a, const __grid_constant__ CnnStepLaunch l) {
  __shared__ TensorTable table;
  load_tensor_table(table, a, l);
  const std::int64_t elements = table.offset[a.tensors];
  for (std::int64_t e = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; e < elements;
       e += std::int64_t(gridDim.x) * blockDim.x) {
    const int t = table.tensor_of(e);
    const int i = int(e - table.offset[t]);
    store_in_image(a.image, table.target[t], i, table.param[t][i]);
  }
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
  int grad = 0, dy = 0;
  for (int i = 0; i < a.layers; ++i) {
    const CnnLayer& L = a.layer[i];
    const int in = L.in_c * L.in_h * L.in_w, out = L.out_c * L.out_h * L.out_w;
    s.launch.act_offset[i + 1] = L.op == CnnLayerOp::view ? s.launch.act_offset[i] : take(out);
    grad = std::max({grad, in, out});
    if (L.op == CnnLayerOp::conv2d) dy = std::max(dy, (L.out_c * dy_stride(L) + 1) / 2);
  }
  s.launch.grad_offset[0] = take(grad);
  s.launch.grad_offset[1] = take(grad);
  // The parameter image (copied in as it is), in layer order: every layer's
  // fp16 weights (forward / linear layout, then a conv's data-gradient
  // layout) and rounded bias, in kImageParts parts (CnnStepLaunch::part_start).
  s.launch.image_offset = at;
  int part = 0;
  for (int i = 0; i < a.layers; ++i) {
    const CnnLayer& L = a.layer[i];
    if (!has_parameters(L)) continue;
    // Part 1 opens at the second parameter layer, part 2 at the first linear
    // layer after the first parameter layer (so part 1 may be empty).
    const int opens = at == s.launch.image_offset ? 0 : part == 0 && L.op == CnnLayerOp::conv2d ? 1
                      : part < 2 && L.op == CnnLayerOp::linear                                  ? 2
                                                                                                : part;
    for (; part < opens; ++part) {
      s.launch.part_start[part] = at - s.launch.image_offset;
      s.launch.part_layer[part] = i;
    }
    if (L.op == CnnLayerOp::conv2d) {
      s.launch.weight_offset[i] = take((L.out_c * forward_stride(L) + 1) / 2);
      if (L.input_gradient) s.launch.weight_t_offset[i] = take((L.in_c * data_stride(L) + 1) / 2);
    }
    if (L.op == CnnLayerOp::linear) s.launch.weight_offset[i] = take((L.out_c * L.in_c * L.in_h * L.in_w + 1) / 2);
    s.launch.bias_offset[i] = take(L.out_c);
  }
  s.launch.image_floats = at - s.launch.image_offset;
  for (; part < kImageParts - 1; ++part) s.launch.part_start[part] = s.launch.image_floats;  // empty parts at the end
  // Zeroed once per block: each conv layer's bordered dY.
  s.launch.zeroed_offset = at;
  for (int i = 0; i < a.layers; ++i) {
    const CnnLayer& L = a.layer[i];
    if (L.op == CnnLayerOp::conv2d && L.input_gradient) s.launch.border_offset[i] = take(bordered_size(L));
  }
  s.launch.zeroed_floats = at - s.launch.zeroed_offset;
  for (int i = 0; i < a.layers; ++i) {  // a dropout layer's keep bits: per element, or per channel (dropout2d)
    const CnnLayer& L = a.layer[i];
    if (L.op == CnnLayerOp::dropout) s.launch.mask_offset[i] = take((L.out_c * L.out_h * L.out_w + 3) / 4);
    if (L.op == CnnLayerOp::dropout2d) s.launch.mask_offset[i] = take((L.out_c + 3) / 4);
  }
  s.launch.tables_offset = at;
  for (int i = 0; i < a.layers; ++i) {  // every conv GEMM's index tables (cnn_step_index_tables), int2 each
    const CnnLayer& L = a.layer[i];
    if (L.op != CnnLayerOp::conv2d) continue;
    s.launch.windows_offset[i] = take(2 * round_up(L.out_h * L.out_w, 16));
    s.launch.taps_offset[i] = take(2 * round_up(L.in_c * L.kernel_h * L.kernel_w, 16));
    if (!L.input_gradient) continue;
    s.launch.data_rows_offset[i] = take(2 * round_up(L.in_h * L.in_w, 16));
    s.launch.data_columns_offset[i] = take(2 * round_up(L.out_c * L.kernel_h * L.kernel_w, 16));
  }
  s.launch.tables_floats = at - s.launch.tables_offset;
  s.launch.dy_offset = dy <= grad ? -1 : take(dy);
  // Each warp's slot of the conv GEMMs (block_gemm); a linear layer's gradient through its ReLU.
  int outputs = 0;
  for (int i = 0; i < a.layers; ++i) outputs = std::max(outputs, a.layer[i].out_c);
  s.launch.reduce_offset = take(std::max(kThreads / 32 * kColumnTiles * 128, outputs));
  for (int i = 0; i < a.layers; ++i)
    s.launch.relu[i] = relu_fused_into(a, i) ? kReluAfter : fused_relu(a, i) ? kReluRunByLayerBefore : 0;
  s.launch.threads = kThreads;
  s.bytes = std::size_t(at) * sizeof(float);
  s.launch.shared_bytes = s.bytes;
  return s;
}

// The gradient workspace (CnnStepLaunch::slice_offset, factor_offset): conv
// tensors in the blocks' slices, in tensor order; with one example per
// block each linear layer's dZ and x in an example's factor row, in layer
// order, else its tensors in the slices too (linear_backward says why).
void plan_gradients(const CnnStepArgs& a, int examples_per_block, CnnStepLaunch& l) {
  const bool factored = examples_per_block == 1;
  l.slice_floats = l.factor_floats = 0;
  for (int i = 0; i < a.layers; ++i) {
    const CnnLayer& L = a.layer[i];
    l.factor_offset[i] = -1;
    if (L.op == CnnLayerOp::linear && factored) {
      l.factor_offset[i] = l.factor_floats;
      l.factor_floats += L.out_c + L.in_c * L.in_h * L.in_w;
    }
  }
  for (int t = 0; t < kCnnStepMaxTensors; ++t) l.slice_offset[t] = -1;
  for (int t = 0; t < a.tensors && t < kCnnStepMaxTensors; ++t)
    for (int i = 0; i < a.layers; ++i) {
      const CnnLayer& L = a.layer[i];
      if ((L.weight == t || L.bias == t) && (L.op == CnnLayerOp::conv2d || !factored)) {
        l.slice_offset[t] = l.slice_floats;
        l.slice_floats += int(a.param_offset[t + 1] - a.param_offset[t]);
      }
    }
}

// Shared memory a block may have beyond the kernel's static arguments copy.
std::size_t dynamic_shared_limit() {
  int device = 0, limit = 0;
  SG_CUDA_CHECK(cudaGetDevice(&device));
  SG_CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  cudaFuncAttributes attributes{};
  SG_CUDA_CHECK(cudaFuncGetAttributes(&attributes, cnn_step_examples));
  return std::size_t(limit) - attributes.sharedSizeBytes;
}

// Blocks of kUpdateThreads for `lanes_per_element` lanes per parameter element.
int element_blocks(const CnnStepArgs& a, int lanes_per_element) {
  const std::int64_t threads = std::int64_t(a.param_offset[a.tensors]) * lanes_per_element;
  return int(std::max<std::int64_t>(1, (threads + kUpdateThreads - 1) / kUpdateThreads));
}

}  // namespace

std::string cnn_step_unsupported(const CnnStepArgs& a) {
  if (a.layers < 1 || a.layers > kCnnStepMaxLayers) return fmt::format("{} layers (1 to {})", a.layers, kCnnStepMaxLayers);
  if (a.tensors > kCnnStepMaxTensors) return fmt::format("{} parameter tensors (at most {})", a.tensors, kCnnStepMaxTensors);
  if (a.batch < 1 || a.rows < a.batch) return "fewer rows than a batch";
  const std::size_t bytes = shared_layout(a).bytes, limit = dynamic_shared_limit();
  if (bytes > limit)
    return fmt::format("an example's activations, weights and work space need {} bytes of shared memory (the GPU "
                       "has {} beyond the step's arguments)",
                       bytes, limit);
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
  plan_gradients(a, per_block, launch);
  return launch;
}

std::vector<int2> cnn_step_index_tables(const CnnStepArgs& a, const CnnStepLaunch& l) {
  std::vector<int2> tables(std::size_t(l.tables_floats / 2), no_patch_index());
  const auto fill = [&](int offset, int count, auto of) {
    for (int i = 0; i < count; ++i) tables[std::size_t((offset - l.tables_offset) / 2 + i)] = of(i);
  };
  for (int li = 0; li < a.layers; ++li) {
    const CnnLayer& L = a.layer[li];
    if (L.op != CnnLayerOp::conv2d) continue;
    fill(l.windows_offset[li], L.out_h * L.out_w, [&](int p) { return window_index(L, p); });
    fill(l.taps_offset[li], L.in_c * L.kernel_h * L.kernel_w, [&](int k) { return tap_index(L, k); });
    if (!L.input_gradient) continue;
    const int kk = L.kernel_h * L.kernel_w, width = L.in_w + L.kernel_w - 1;
    const int bplane = (L.in_h + L.kernel_h - 1) * width;
    fill(l.data_rows_offset[li], L.in_h * L.in_w, [&](int m) { return make_int2((m / L.in_w) * width + m % L.in_w, 0); });
    fill(l.data_columns_offset[li], L.out_c * kk, [&](int k) {  // (co, ky, kx) -> its flipped offset
      const int co = k / kk, ky = (k % kk) / L.kernel_w, kx = k % L.kernel_w;
      return make_int2(co * bplane + (L.kernel_h - 1 - ky) * width + (L.kernel_w - 1 - kx), 0);
    });
  }
  return tables;
}

CnnStepLaunch cnn_step_layout(const CnnStepArgs& a, int examples_per_block) {
  CnnStepLaunch launch = shared_layout(a).launch;
  plan_gradients(a, examples_per_block, launch);
  return launch;
}

std::size_t cnn_step_shared_bytes(const CnnStepArgs& a) { return shared_layout(a).bytes + sizeof(SharedArguments); }

std::vector<std::string> cnn_step_phase_names(const CnnStepArgs& a) {
  static constexpr const char* kOps[] = {"conv2d", "max_pool2d", "relu", "dropout2d", "dropout", "view", "linear"};
  std::vector<std::string> names{
      "arguments, the first example's pixels and the image's first part into shared memory"};
  const auto op_text = [&](int i) {
    return relu_fused_into(a, i) ? fmt::format("{}+relu", kOps[int(a.layer[i].op)]) : std::string(kOps[int(a.layer[i].op)]);
  };
  for (int i = 0; i < a.layers; ++i)
    if (a.layer[i].op != CnnLayerOp::view && !fused_relu(a, i))
      names.push_back(fmt::format("forward layer {} {}", i, op_text(i)));
  names.push_back("softmax cross-entropy");
  for (int i = a.layers; i-- > 0;) {
    const CnnLayer& L = a.layer[i];
    if (L.op == CnnLayerOp::view || fused_relu(a, i)) continue;
    if (L.op == CnnLayerOp::conv2d && L.input_gradient) {
      names.push_back(fmt::format("backward layer {} conv2d: weight and bias gradients", i));
      names.push_back(fmt::format("backward layer {} conv2d: input gradient", i));
      continue;
    }
    names.push_back(fmt::format("backward layer {} {}", i, op_text(i)));
    if ((L.op == CnnLayerOp::conv2d || L.op == CnnLayerOp::linear) && !L.input_gradient) break;
  }
  names.push_back("other blocks and examples, then the update kernel's start");
  names.push_back("update kernel (its block 0)");
  return names;
}

std::size_t cnn_step_workspace_bytes(const CnnStepArgs& a, const CnnStepLaunch& l) {
  return (std::size_t(l.blocks) * std::size_t(l.slice_floats) +
          std::size_t(a.batch) * (std::size_t(l.factor_floats) + 1)) * sizeof(float);
}

std::size_t cnn_step_image_bytes(const CnnStepLaunch& l) { return std::size_t(l.image_floats) * sizeof(float); }

void launch_cnn_step_image(const CnnStepArgs& a, const CnnStepLaunch& l, cudaStream_t stream) {
  SG_CUDA_CHECK(cudaMemsetAsync(a.image, 0, cnn_step_image_bytes(l), stream));  // every padding zero
  cnn_step_build_image<<<element_blocks(a, 1), kUpdateThreads, 0, stream>>>(a, l);
  SG_LAUNCH_CHECK("cnn_step_build_image");
}

void launch_cnn_step(const CnnStepArgs& a, const CnnStepLaunch& l, cudaStream_t stream, bool dependent) {
  cnn_step_examples<<<l.blocks, l.threads, l.shared_bytes, stream>>>(a, l);
  SG_LAUNCH_CHECK("cnn_step_examples");
  const int update_phase = a.phase_clock ? static_cast<int>(cnn_step_phase_names(a).size()) - 1 : 0;
  launch_dependent(cnn_step_update, LaunchGeometry{dim3(element_blocks(a, kSumParts) + 1), dim3(kUpdateThreads)},
                   stream, dependent, a, l, l.blocks, update_phase);
}

}  // namespace sg::cuda
