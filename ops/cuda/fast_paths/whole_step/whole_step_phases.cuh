#pragma once
// The phases of the whole-step kernel (whole_step.cu, which alone includes
// this): the block's shared-memory carve, the batch fetch, the tensor-core
// tiles of the forward, dgrad and weight updates, the logits layer and the
// softmax cross-entropy kept in each block's shared memory, the bias updates.
// In an unnamed namespace, as they were in the kernel's own file: each has
// its callers in that one translation unit.
#include <cooperative_groups.h>
#include <mma.h>

#include <cfloat>
#include <cstdint>

#include "ops/cuda/fast_paths/whole_step/step_common.cuh"
#include "ops/cuda/fast_paths/whole_step/whole_step.hpp"
#include "ops/cuda/sgd_step.cuh"
#include "ops/cuda/softmax_row.cuh"
#include "ops/cuda/warp_reduce.cuh"

namespace sg::cuda {
namespace {

namespace cg = cooperative_groups;
using namespace nvcuda;

constexpr int kWarps = 8;
constexpr int kBlockThreads = kWarps * 32;
constexpr int kMaxMTiles = kWholeStepMaxBatch / 16;

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major>;
using FragAT = wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::col_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major>;
using FragBT = wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Per-block shared memory, carved from one dynamic allocation.
struct Shared {
  __half* x;        // [batch, dims[0]] the fetched batch
  float* partial;   // [kWarps][batch][16] split-K partial tiles
  float* wtile;     // [kWarps][16*16] one weight-gradient tile per warp
  float* dlogits;   // [batch, classes], values rounded to fp16
  float* row_loss;  // [batch]
  int* label;       // [batch]
  int* row;         // [batch] dataset row of each batch row
  float* logits;    // [batch, classes]
  __half* w_last;   // [classes padded to 16 or 32, K] the logits layer's weights
};

// Rows the logits layer's weights are padded to (wmma tiles of 16).
__host__ __device__ int padded_classes(int classes) { return classes <= 16 ? 16 : 32; }


__host__ __device__ std::size_t shared_bytes(int batch, int d0, int k_last, int classes, Shared* carve = nullptr,
                                             unsigned char* base = nullptr) {
  std::size_t off = 0;
  auto take = [&](std::size_t bytes) {
    const std::size_t at = off;
    off = (off + bytes + 127) / 128 * 128;
    return at;
  };
  const std::size_t x = take(std::size_t(batch) * d0 * sizeof(__half));
  const std::size_t partial = take(std::size_t(kWarps) * batch * 16 * sizeof(float));
  const std::size_t wtile = take(std::size_t(kWarps) * 256 * sizeof(float));
  const std::size_t dl = take(std::size_t(batch) * kWholeStepMaxClasses * sizeof(float));
  const std::size_t rl = take(std::size_t(batch) * sizeof(float));
  const std::size_t lb = take(std::size_t(batch) * sizeof(int));
  const std::size_t rw = take(std::size_t(batch) * sizeof(int));
  const std::size_t lg = take(std::size_t(batch) * kWholeStepMaxClasses * sizeof(float));
  const std::size_t wl = take(std::size_t(padded_classes(classes)) * k_last * sizeof(__half));
  if (carve) {
    carve->x = reinterpret_cast<__half*>(base + x);
    carve->partial = reinterpret_cast<float*>(base + partial);
    carve->wtile = reinterpret_cast<float*>(base + wtile);
    carve->dlogits = reinterpret_cast<float*>(base + dl);
    carve->row_loss = reinterpret_cast<float*>(base + rl);
    carve->label = reinterpret_cast<int*>(base + lb);
    carve->row = reinterpret_cast<int*>(base + rw);
    carve->logits = reinterpret_cast<float*>(base + lg);
    carve->w_last = reinterpret_cast<__half*>(base + wl);
  }
  return off;
}

__device__ int warp_id() { return threadIdx.x / 32; }
__device__ int lane_id() { return threadIdx.x % 32; }
__device__ int grid_warp() { return blockIdx.x * kWarps + warp_id(); }
__device__ int grid_warps() { return gridDim.x * kWarps; }
__device__ std::int64_t grid_thread() { return std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ std::int64_t grid_threads() { return std::int64_t(gridDim.x) * blockDim.x; }

// This thread's (or warp's) rank among `total` when a task's workers are
// numbered from `offset`: tasks sharing a phase start on different blocks
// instead of queueing on the first ones.
__device__ std::int64_t rotated(std::int64_t me, std::int64_t total, std::int64_t offset) {
  return (me + total - offset % total) % total;
}

// The batch: 16 pixels per load, scaled as the batch_fetch kernel scales them.
__device__ void fetch_batch(const WholeStepArgs& a, const Shared& sh) {
  const int batch = a.batch, cols = a.dims[0];
  const std::int64_t base = std::int64_t(*a.step % (a.rows / batch)) * batch;
  for (int i = threadIdx.x; i < batch; i += blockDim.x) {
    const int row = a.perm[base + i];
    sh.row[i] = row;
    sh.label[i] = a.labels[row];
  }
  __syncthreads();
  const int chunks_per_row = cols / 16;
#pragma unroll 8
  for (int e = threadIdx.x; e < batch * chunks_per_row; e += blockDim.x) {
    const int r = e / chunks_per_row, c = (e % chunks_per_row) * 16;
    const std::int64_t row = sh.row[r];
    const uint4 packed = *reinterpret_cast<const uint4*>(a.images + row * cols + c);
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(&packed);
    __half* dst = sh.x + std::int64_t(r) * cols + c;
#pragma unroll
    for (int k = 0; k < 16; ++k) dst[k] = __float2half(float(bytes[k]) * a.scale + a.shift);
  }
}

// Sums the warps' partial [batch,16] tiles and hands each element to `store(r, c, sum)`.
template <typename Store>
__device__ void reduce_partials(const Shared& sh, int batch, Store&& store) {
  __syncthreads();
  for (int e = threadIdx.x; e < batch * 16; e += blockDim.x) {
    float s = 0.f;
    for (int w = 0; w < kWarps; ++w) s += sh.partial[w * batch * 16 + e];
    store(e / 16, e % 16, s);
  }
  __syncthreads();
}

// One 16-column output tile of A[B, ksteps*16] times a [ksteps*16, 16] slice
// of W, the block's warps splitting the k-steps; `b_tile(ks)` points at the
// slice's 16x16 block ks (leading dimension ldb). Leaves the warps' partial
// sums in shared memory for reduce_partials.
template <typename FragBType, typename BTile>
__device__ void split_k_tile(const __half* A, int lda, int ksteps, int ldb, BTile&& b_tile, int batch,
                             const Shared& sh) {
  const int mtiles = batch / 16;
  FragC acc[kMaxMTiles];
#pragma unroll
  for (int m = 0; m < kMaxMTiles; ++m) wmma::fill_fragment(acc[m], 0.f);
#pragma unroll 4
  for (int ks = warp_id(); ks < ksteps; ks += kWarps) {
    FragBType b;
    wmma::load_matrix_sync(b, b_tile(ks), ldb);
#pragma unroll
    for (int m = 0; m < kMaxMTiles; ++m)
      if (m < mtiles) {
        FragA a;
        wmma::load_matrix_sync(a, A + std::int64_t(m) * 16 * lda + ks * 16, lda);
        wmma::mma_sync(acc[m], a, b, acc[m]);
      }
  }
#pragma unroll
  for (int m = 0; m < kMaxMTiles; ++m)
    if (m < mtiles) wmma::store_matrix_sync(sh.partial + warp_id() * batch * 16 + m * 256, acc[m], 16, wmma::mem_row_major);
}

// out[B,N] = act(A[B,K] W[N,K]^T + bias): a block per 16 output columns.
// Activations whose backward reads the forward input also store the
// pre-activation into pre[B,N].
template <Activation A>
__device__ void forward_layer(const __half* A_in, const __half* W, const __half* bias, __half* out, __half* pre,
                              int batch, int K, int N, const Shared& sh) {
  for (int t = blockIdx.x; t < N / 16; t += gridDim.x) {
    // W^T's column block t is W's row block t, read column-major.
    split_k_tile<FragBT>(A_in, K, K / 16, K, [&](int ks) { return W + std::int64_t(t) * 16 * K + ks * 16; }, batch,
                         sh);
    reduce_partials(sh, batch, [&](int r, int c, float s) {
      const int n = t * 16 + c;
      out[std::int64_t(r) * N + n] = forward_epilogue<A>(s, bias[n], pre, std::int64_t(r) * N + n);
    });
  }
}

// dX[B,K] = act'(dY[B,N] W[N,K]) given saved[B,K] (for ReLU: the mask
// act > 0, rounded to fp16 like DRELU).
template <Activation A>
__device__ void dgrad_layer(const __half* dY, const __half* W, const __half* saved, __half* dX, int batch, int N,
                            int K, const Shared& sh) {
  for (int t = blockIdx.x; t < K / 16; t += gridDim.x) {
    split_k_tile<FragB>(dY, N, N / 16, K, [&](int ks) { return W + std::int64_t(ks) * 16 * K + t * 16; }, batch, sh);
    reduce_partials(sh, batch, [&](int r, int c, float s) {
      const std::int64_t at = std::int64_t(r) * K + t * 16 + c;
      dX[at] = activation_backward<A>(s, saved[at]);
    });
  }
}

// W[N,K] = sgd(W, dY[B,N]^T X[B,K]): one warp per 16x16 tile of W. With
// `grad_out` (WholeStepArgs::weight_grad) the gradient goes there instead,
// rounded to fp16 as the graph's value, and W is left to the update stage.
__device__ void weight_update(const __half* dY, const __half* X, __half* W, int batch, int N, int K,
                              const UpdateScalars* scalars, const Shared& sh, std::int64_t warp_offset,
                              __half* grad_out) {
  const UpdateScalars s = *scalars;
  const int ktiles = K / 16, tiles = (N / 16) * ktiles;
  float* tile = sh.wtile + warp_id() * 256;
  const int lane = lane_id(), row = lane / 2, half = lane % 2;
  for (std::int64_t t = rotated(grid_warp(), grid_warps(), warp_offset); t < tiles; t += grid_warps()) {
    const int nt = int(t / ktiles), kt = int(t % ktiles);
    FragC acc;
    wmma::fill_fragment(acc, 0.f);
#pragma unroll
    for (int bc = 0; bc < batch / 16; ++bc) {
      FragAT a;
      FragB b;
      wmma::load_matrix_sync(a, dY + std::int64_t(bc) * 16 * N + nt * 16, N);
      wmma::load_matrix_sync(b, X + std::int64_t(bc) * 16 * K + kt * 16, K);
      wmma::mma_sync(acc, a, b, acc);
    }
    wmma::store_matrix_sync(tile, acc, 16, wmma::mem_row_major);
    __syncwarp();
    const std::int64_t at = std::int64_t(nt * 16 + row) * K + kt * 16 + half * 8;
    if (grad_out) {
      uint4 rounded;
      auto* g = reinterpret_cast<__half*>(&rounded);
#pragma unroll
      for (int q = 0; q < 8; ++q) g[q] = __float2half(tile[row * 16 + half * 8 + q]);
      *reinterpret_cast<uint4*>(grad_out + at) = rounded;
      __syncwarp();
      continue;
    }
    __half* w = W + at;
    uint4 packed = *reinterpret_cast<const uint4*>(w);
    auto* v = reinterpret_cast<__half*>(&packed);
#pragma unroll
    for (int q = 0; q < 8; ++q) v[q] = __float2half(sgd_step_folded(__half2float(v[q]), tile[row * 16 + half * 8 + q], s));
    *reinterpret_cast<uint4*>(w) = packed;
    __syncwarp();
  }
}

// Every block: logits[B,C] = A[B,K] W[C,K]^T + bias into its shared memory,
// rounded to fp16 as the stored logits are. W is staged zero-padded to whole
// 16-row tiles so the tensor-core tile code applies. Each block computing
// them itself saves a grid barrier.
__device__ void logits_in_block(const __half* A, const __half* W, const __half* bias, int batch, int K, int C,
                                const Shared& sh) {
  const int rows = padded_classes(C), vectors_per_row = K / 8;
  for (int i = threadIdx.x; i < rows * vectors_per_row; i += blockDim.x) {
    const int row = i / vectors_per_row, col = (i % vectors_per_row) * 8;
    const uint4 v = row < C ? *reinterpret_cast<const uint4*>(W + std::int64_t(row) * K + col) : make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4*>(sh.w_last + std::int64_t(row) * K + col) = v;
  }
  __syncthreads();
  for (int nt = 0; nt < rows / 16; ++nt) {
    split_k_tile<FragBT>(A, K, K / 16, K, [&](int ks) { return sh.w_last + std::int64_t(nt) * 16 * K + ks * 16; },
                         batch, sh);
    reduce_partials(sh, batch, [&](int r, int c, float s) {
      const int cls = nt * 16 + c;
      if (cls < C) sh.logits[r * C + cls] = __half2float(__float2half(s + __half2float(bias[cls])));
    });
  }
}

// Every block: dlogits = (softmax - onehot) / B rounded to fp16, as the xent
// kernel computes them; block 0 also stores the loss, summed in the xent
// kernel's order (rows r, r+32, ... per warp, then warps in order).
__device__ void softmax_xent(int batch, int C, float* loss, const Shared& sh) {
#pragma unroll
  for (int r = warp_id(); r < batch; r += kWarps) {
    float* dlogits = sh.dlogits + r * C;  // fp32 buffer, fp16 values
    const float row_loss = softmax_xent_lanes_to<32, 1>(sh.logits + r * C, C, sh.label[r], 1.f / float(batch), true,
                                                     [&](std::int64_t c, float g) { dlogits[c] = __half2float(__float2half(g)); });
    if (lane_id() == 0) sh.row_loss[r] = row_loss;
  }
  __syncthreads();
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    float total = 0.f;
    for (int w = 0; w < 32; ++w) {
      float partial = 0.f;
      for (int r = w; r < batch; r += 32) partial += sh.row_loss[r];
      total += partial;
    }
    *loss = total * (1.f / float(batch));
  }
}

// grad[B,K] = act'(dlogits[B,C] W[C,K]) given saved[B,K] (ReLU: act > 0).
template <Activation A>
__device__ void logits_backward(const Shared& sh, const __half* W, const __half* saved, __half* grad, int batch, int C,
                                int K) {
  for (std::int64_t e = grid_thread(); e < std::int64_t(batch) * K; e += grid_threads()) {
    const int r = int(e / K), k = int(e % K);
    float s = 0.f;
#pragma unroll 8
    for (int c = 0; c < C; ++c) s += sh.dlogits[r * C + c] * __half2float(W[std::int64_t(c) * K + k]);
    grad[e] = activation_backward<A>(s, saved[e]);
  }
}

// W[C,K] = sgd(W, dlogits^T X) for the logits layer (or the gradient into
// `grad_out`, as weight_update).
__device__ void logits_weight_update(const Shared& sh, const __half* X, __half* W, int batch, int C, int K,
                                     const UpdateScalars* scalars, std::int64_t thread_offset, __half* grad_out) {
  const UpdateScalars s = *scalars;
  for (std::int64_t e = rotated(grid_thread(), grid_threads(), thread_offset); e < std::int64_t(C) * K;
       e += grid_threads()) {
    const int c = int(e / K), k = int(e % K);
    float g = 0.f;
#pragma unroll
    for (int r = 0; r < batch; ++r) g += sh.dlogits[r * C + c] * __half2float(X[std::int64_t(r) * K + k]);
    if (grad_out) grad_out[e] = __float2half(g);
    else W[e] = __float2half(sgd_step_folded(__half2float(W[e]), g, s));
  }
}

struct HalfReader {
  const __half* p;
  __device__ float operator[](std::int64_t i) const { return __half2float(p[i]); }
};

// b[N] = sgd(b, column sums of dY[B,N]) by `threads` threads starting at
// `thread` (or the sums into `grad_out`, as weight_update). Rows reads dY[i]
// as float (a float pointer, or HalfReader for fp16).
template <typename Rows>
__device__ void bias_update(Rows dY, __half* b, int batch, int N, const UpdateScalars* scalars,
                            std::int64_t thread, std::int64_t threads, __half* grad_out) {
  for (std::int64_t n = thread; n < N; n += threads) {
    float g = 0.f;
#pragma unroll
    for (int r = 0; r < batch; ++r) g += dY[std::int64_t(r) * N + n];
    if (grad_out) grad_out[n] = __float2half(g);
    else b[n] = __float2half(sgd_step_folded(__half2float(b[n]), g, *scalars));
  }
}

// The barrier between phases: the whole cluster, or the whole cooperative grid.
template <bool kCluster>
__device__ void phase_barrier() {
  if constexpr (kCluster) cg::this_cluster().sync();
  else cg::this_grid().sync();
}

// What the backward of hidden layer l's activation reads: its output, or
// (gelu, gelu_tanh, silu) its pre-activation.
template <Activation A>
__device__ const __half* saved_for_backward(const WholeStepArgs& a, int l) {
  if constexpr (kBackwardReadsInput<A>) return a.pre[l];
  else return a.act[l];
}

}  // namespace
}  // namespace sg::cuda
