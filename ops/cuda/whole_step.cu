// One cooperative kernel per training step (see whole_step.hpp). Phases, with
// a grid-wide barrier after each (L layers, 0-based l):
//   fetch      every block gathers the batch into its own shared memory
//   F_l        hidden layer l: act[l] = act(x W_l^T + b_l)           (tensor cores)
//              (and pre[l] = x W_l^T + b_l where the backward reads it)
//   softmax    every block: the logits and dlogits in its shared memory
//              (block 0 also stores the loss); grad[L-2] = act'((dlogits
//              W_{L-1}), saved L-2)
//   Q_l        l = L-2 .. 0: grad[l-1] = act'((grad[l] W_l), saved l-1),
//              saved l being act[l] or (gelu, gelu_tanh, silu) pre[l];
//              W_{l+1} -= lr grad[l+1]^T act[l]; b_l -= lr colsum(grad[l])
//              (and b_{L-1} from dlogits);
//              at l = 0 also W_0 -= lr grad[0]^T x and the step advances
// A weight is only updated in the phase after the last one that reads it,
// so no block can see a half-updated matrix. Loops over the batch or the
// classes are unrolled so their loads are in flight together: a phase is
// bound by load latency, not by arithmetic.
#include <cooperative_groups.h>
#include <mma.h>

#include <cfloat>
#include <cstdlib>

#include <fmt/format.h>

#include "ops/cuda/activation.cuh"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/warp_reduce.cuh"
#include "ops/cuda/whole_step.hpp"

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

// PyTorch SGD without momentum, as the cuBLASLt path computes it:
// w' = (1 - lr*wd) * w - lr * g, in fp32, rounded once.
__device__ float sgd(float w, float g, const SgdScalars& s) { return s.neg_lr * g + s.one_minus_lr_wd * w; }

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

// The activation's backward of the fp32 sum s given the saved fp16 value v
// (the output for relu, tanh, sigmoid; the pre-activation for the others),
// rounded once to fp16 as our one-pass and small-K dgrad kernels round it.
template <Activation A>
__device__ __half activation_backward(float s, __half v) {
  if constexpr (A == Activation::relu)  // (the select these phases always made: the ReLU instance is unchanged)
    return __half2float(v) > 0.f ? __float2half(s) : __float2half(0.f);
  else
    return __float2half(ActivationMath<A>::backward(s, __half2float(v)));
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
      if constexpr (A == Activation::relu) {  // (the epilogue this phase always had)
        out[std::int64_t(r) * N + n] = __float2half(fmaxf(s + __half2float(bias[n]), 0.f));
      } else {
        // act(z) of z rounded to fp16, as the small-batch forward and the graph's bias_add and activation nodes compute it
        const __half z = __float2half(s + __half2float(bias[n]));
        if constexpr (kBackwardReadsInput<A>) pre[std::int64_t(r) * N + n] = z;
        out[std::int64_t(r) * N + n] = __float2half(ActivationMath<A>::forward(__half2float(z)));
      }
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

// W[N,K] = sgd(W, dY[B,N]^T X[B,K]): one warp per 16x16 tile of W.
__device__ void weight_update(const __half* dY, const __half* X, __half* W, int batch, int N, int K,
                              const SgdScalars* scalars, const Shared& sh, std::int64_t warp_offset) {
  const SgdScalars s = *scalars;
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
    __half* w = W + std::int64_t(nt * 16 + row) * K + kt * 16 + half * 8;
    uint4 packed = *reinterpret_cast<const uint4*>(w);
    auto* v = reinterpret_cast<__half*>(&packed);
#pragma unroll
    for (int q = 0; q < 8; ++q) v[q] = __float2half(sgd(__half2float(v[q]), tile[row * 16 + half * 8 + q], s));
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
  const int lane = lane_id();
#pragma unroll
  for (int r = warp_id(); r < batch; r += kWarps) {
    const float z = lane < C ? sh.logits[r * C + lane] : -FLT_MAX;
    const float mx = warp_max(z);
    const float sum = warp_sum(lane < C ? __expf(z - mx) : 0.f);
    const int label = sh.label[r];
    const float z_label = __shfl_sync(0xffffffffu, z, label);
    if (lane == 0) sh.row_loss[r] = logf(sum) + mx - z_label;
    if (lane < C) {
      const float p = __expf(z - mx) / sum;
      sh.dlogits[r * C + lane] = __half2float(__float2half((p - (lane == label ? 1.f : 0.f)) * (1.f / float(batch))));
    }
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

// W[C,K] = sgd(W, dlogits^T X) for the logits layer.
__device__ void logits_weight_update(const Shared& sh, const __half* X, __half* W, int batch, int C, int K,
                                     const SgdScalars* scalars, std::int64_t thread_offset) {
  const SgdScalars s = *scalars;
  for (std::int64_t e = rotated(grid_thread(), grid_threads(), thread_offset); e < std::int64_t(C) * K;
       e += grid_threads()) {
    const int c = int(e / K), k = int(e % K);
    float g = 0.f;
#pragma unroll
    for (int r = 0; r < batch; ++r) g += sh.dlogits[r * C + c] * __half2float(X[std::int64_t(r) * K + k]);
    W[e] = __float2half(sgd(__half2float(W[e]), g, s));
  }
}

struct HalfReader {
  const __half* p;
  __device__ float operator[](std::int64_t i) const { return __half2float(p[i]); }
};

// b[N] = sgd(b, column sums of dY[B,N]) by `threads` threads starting at `thread`.
// Rows reads dY[i] as float (a float pointer, or HalfReader for fp16).
template <typename Rows>
__device__ void bias_update(Rows dY, __half* b, int batch, int N, const SgdScalars* scalars,
                            std::int64_t thread, std::int64_t threads) {
  for (std::int64_t n = thread; n < N; n += threads) {
    float g = 0.f;
#pragma unroll
    for (int r = 0; r < batch; ++r) g += dY[std::int64_t(r) * N + n];
    b[n] = __float2half(sgd(__half2float(b[n]), g, *scalars));
  }
}

__device__ void mark_phase(const WholeStepArgs& a, int& phase) {
  if (a.phase_clock && blockIdx.x == 0 && threadIdx.x == 0) {
    unsigned long long ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    a.phase_clock[phase] = ns;
  }
  ++phase;
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

// kBatch is a template argument so every loop over the batch has a constant
// trip count and unrolls: the phases are bound by load latency, and loads
// of an unrolled loop are in flight together. A: the hidden layers' activation.
template <bool kCluster, int kBatch, Activation A>
__global__ void __launch_bounds__(kBlockThreads, 1) whole_step_kernel(const WholeStepArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];
  Shared sh;
  shared_bytes(kBatch, a.dims[0], a.dims[a.layers - 1], a.dims[a.layers], &sh, smem);
  const int L = a.layers, C = a.dims[L];
  constexpr int B = kBatch;
  int phase = 0;
  mark_phase(a, phase);

  fetch_batch(a, sh);
  __syncthreads();
  for (int l = 0; l + 1 < L; ++l) {
    forward_layer<A>(l == 0 ? sh.x : a.act[l - 1], a.weight[l], a.bias[l], a.act[l], a.pre[l], B, a.dims[l],
                     a.dims[l + 1], sh);
    phase_barrier<kCluster>();
    mark_phase(a, phase);
  }
  // Every block: the logits, the softmax gradient (kept in shared memory for
  // the rest of the step), and its share of the last hidden layer's gradient.
  logits_in_block(L == 1 ? sh.x : a.act[L - 2], a.weight[L - 1], a.bias[L - 1], B, a.dims[L - 1], C, sh);
  softmax_xent(B, C, a.loss, sh);
  __syncthreads();
  if (L >= 2) logits_backward<A>(sh, a.weight[L - 1], saved_for_backward<A>(a, L - 2), a.grad[L - 2], B, C, a.dims[L - 1]);
  phase_barrier<kCluster>();  // the logits layer's W and b were read above: update them only now
  mark_phase(a, phase);
  if (L == 1) {
    bias_update(sh.dlogits, a.bias[0], B, C, a.bias_sgd[0], grid_thread(), grid_threads());
    logits_weight_update(sh, sh.x, a.weight[0], B, C, a.dims[0], a.weight_sgd[0], (C + 31) / 32 * 32);
  }

  for (int l = L - 2; l >= 0; --l) {  // grad[l] is complete
    // The dgrad takes blocks 0.. (one per 16 columns); the updates are laid
    // out after it in warp order so every task starts on idle blocks.
    std::int64_t warps_used = 0;
    if (l >= 1) {
      dgrad_layer<A>(a.grad[l], a.weight[l], saved_for_backward<A>(a, l - 1), a.grad[l - 1], B, a.dims[l + 1],
                     a.dims[l], sh);
      warps_used = std::int64_t(min(int(gridDim.x), a.dims[l] / 16)) * kWarps;
    }
    if (l + 1 == L - 1) {
      logits_weight_update(sh, a.act[l], a.weight[l + 1], B, C, a.dims[l + 1], a.weight_sgd[l + 1], warps_used * 32);
      warps_used += (std::int64_t(C) * a.dims[l + 1] + 31) / 32;
      bias_update(sh.dlogits, a.bias[l + 1], B, C, a.bias_sgd[l + 1],
                  rotated(grid_thread(), grid_threads(), warps_used * 32), grid_threads());
      warps_used += 1;
    } else {
      weight_update(a.grad[l + 1], a.act[l], a.weight[l + 1], B, a.dims[l + 2], a.dims[l + 1], a.weight_sgd[l + 1], sh,
                    warps_used);
      warps_used += std::int64_t(a.dims[l + 2] / 16) * (a.dims[l + 1] / 16);
    }
    bias_update(HalfReader{a.grad[l]}, a.bias[l], B, a.dims[l + 1], a.bias_sgd[l],
                rotated(grid_thread(), grid_threads(), warps_used * 32), grid_threads());
    warps_used += (a.dims[l + 1] + 31) / 32;
    if (l == 0) {
      weight_update(a.grad[0], sh.x, a.weight[0], B, a.dims[1], a.dims[0], a.weight_sgd[0], sh, warps_used);
    } else {
      phase_barrier<kCluster>();
      mark_phase(a, phase);
    }
  }
  __syncthreads();
  mark_phase(a, phase);  // block 0's own end: the others finish about then
  // Every block read the step counter in its fetch, several barriers ago.
  if (blockIdx.x == 0 && threadIdx.x == 0) *a.step += 1;
}

std::vector<std::string> per_step_phase_names(int layers) {
  std::vector<std::string> names;
  for (int l = 0; l + 1 < layers; ++l)
    names.push_back(l == 0 ? "fetch + layer 1 forward" : fmt::format("layer {} forward", l + 1));
  if (layers == 1) return {"fetch + logits + softmax-xent", "logits-layer SGD"};
  names.push_back(fmt::format("logits + softmax-xent + layer {} dgrad", layers));
  for (int l = layers - 2; l >= 0; --l)
    names.push_back(l >= 1 ? fmt::format("layer {} dgrad + layer {} SGD", l + 1, l + 2)
                           : fmt::format("layer 2 SGD + layer 1 SGD"));
  return names;
}

}  // namespace

std::vector<std::string> whole_step_phase_names(const WholeStepArgs& args, const WholeStepLaunch& launch) {
  return launch.resident ? resident_step_phase_names(args.layers) : per_step_phase_names(args.layers);
}

std::string whole_step_unsupported(const WholeStepArgs& a) {
  if (a.layers < 1 || a.layers > kWholeStepMaxLayers)
    return fmt::format("{} layers (1..{} supported)", a.layers, kWholeStepMaxLayers);
  if (a.batch % 16 != 0 || a.batch < 16 || a.batch > kWholeStepMaxBatch)
    return fmt::format("batch {} (a multiple of 16 up to {} supported)", a.batch, kWholeStepMaxBatch);
  for (int l = 0; l < a.layers; ++l)
    if (a.dims[l] % 16 != 0 || a.dims[l] <= 0)
      return fmt::format("layer width {} is not a multiple of 16", a.dims[l]);
  const int classes = a.dims[a.layers];
  if (classes < 1 || classes > kWholeStepMaxClasses)
    return fmt::format("{} classes (1..{} supported)", classes, kWholeStepMaxClasses);
  if (a.rows < a.batch) return "fewer dataset rows than one batch";
  const std::size_t smem = shared_bytes(a.batch, a.dims[0], a.dims[a.layers - 1], a.dims[a.layers]);
  if (smem > std::size_t(current_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin)))
    return fmt::format("needs {} bytes of shared memory per block", smem);
  return {};
}

namespace {

using KernelFn = void (*)(WholeStepArgs);

template <bool kCluster>
KernelFn kernel_for(int batch, Activation activation) {
  return with_activation(activation, [&](auto act) -> KernelFn {
    constexpr Activation A = decltype(act)::value;
    switch (batch) {
      case 16: return whole_step_kernel<kCluster, 16, A>;
      case 32: return whole_step_kernel<kCluster, 32, A>;
      case 48: return whole_step_kernel<kCluster, 48, A>;
      case 64: return whole_step_kernel<kCluster, 64, A>;
    }
    throw CudaError(fmt::format("whole_step_kernel: no instance for batch {}", batch));
  });
}

// Blocks the widest phase can keep busy: more only make barriers dearer.
std::int64_t useful_blocks(const WholeStepArgs& a) {
  std::int64_t want = (std::int64_t(a.batch) * a.dims[a.layers] + kWarps - 1) / kWarps;  // logits: a warp each
  for (int l = 0; l < a.layers; ++l) {
    want = std::max<std::int64_t>(want, a.dims[l + 1] / 16);  // forward tiles
    want = std::max<std::int64_t>(want, a.dims[l] / 16);      // dgrad tiles
    want = std::max<std::int64_t>(want, (std::int64_t(a.dims[l + 1] / 16) * (a.dims[l] / 16) + kWarps - 1) / kWarps);
  }
  return want;
}

cudaLaunchConfig_t cluster_config(int blocks, std::size_t smem, cudaStream_t stream, cudaLaunchAttribute& attr) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(blocks));
  cfg.blockDim = dim3(kBlockThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = unsigned(blocks);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return cfg;
}

// The largest cluster (16, else 8) of which one fits on this GPU; 0 if none.
int largest_cluster(KernelFn kernel, std::size_t smem) {
  for (int size : {16, 8}) {
    cudaLaunchAttribute attr{};
    const cudaLaunchConfig_t cfg = cluster_config(size, smem, nullptr, attr);
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) == cudaSuccess && clusters > 0)
      return size;
    (void)cudaGetLastError();  // a refused size is an answer, not an error
  }
  return 0;
}

}  // namespace

WholeStepLaunch plan_whole_step_launch(const WholeStepArgs& a, int steps_per_launch, const WholeStepChoice& choice) {
  int per_sm = 0;
  const int sms = multiprocessor_count(), major = current_device_attribute(cudaDevAttrComputeCapabilityMajor);
  const std::size_t smem = shared_bytes(a.batch, a.dims[0], a.dims[a.layers - 1], a.dims[a.layers]);
  if (backward_reads_input(a.activation))
    for (int l = 0; l + 1 < a.layers; ++l)
      if (!a.pre[l])
        throw CudaError(fmt::format("whole_step_kernel: {}'s backward needs hidden layer {}'s pre-activation",
                                    activation_op_name(a.activation), l + 1));
  const KernelFn grid_kernel = kernel_for<false>(a.batch, a.activation);
  SG_CUDA_CHECK(cudaFuncSetAttribute(grid_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  SG_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, grid_kernel, kBlockThreads, smem));
  if (per_sm < 1) throw CudaError("whole_step_kernel: no block fits on a multiprocessor");
  const std::int64_t want = useful_blocks(a);
  WholeStepLaunch grid{int(std::min<std::int64_t>(want, std::int64_t(sms) * per_sm)), false};

  const WholeStepVariant mode = choice.variant;
  if (mode == WholeStepVariant::grid || major < 9) return grid;
  if (((mode == WholeStepVariant::automatic && steps_per_launch > 1) || mode == WholeStepVariant::resident) &&
      resident_step_unsupported(a, choice.resident_cluster).empty()) {
    WholeStepLaunch resident;
    resident.resident = true;
    resident.layout = plan_resident_layout(a, choice.resident_cluster);
    resident.blocks = resident.layout.cluster;
    resident.cluster = true;
    return resident;
  }
  const KernelFn cluster_kernel = kernel_for<true>(a.batch, a.activation);
  SG_CUDA_CHECK(cudaFuncSetAttribute(cluster_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  SG_CUDA_CHECK(cudaFuncSetAttribute(cluster_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  const int cluster = largest_cluster(cluster_kernel, smem);
  if (cluster == 0) return grid;
  // Measured on an H100 (docs/performance.md): one cluster is no faster than
  // the grid at width 128 and slower from 256 up, so it runs only on request.
  if (mode == WholeStepVariant::cluster) return {int(std::min<std::int64_t>(want, cluster)), true};
  return grid;
}

void launch_whole_step(const WholeStepArgs& args, const WholeStepLaunch& launch, cudaStream_t stream, int steps) {
  if (launch.blocks < 1) throw CudaError("whole_step_kernel: launched with no blocks");
  if (launch.resident) {
    launch_resident_steps(args, launch.layout, steps, stream);
    return;
  }
  for (int s = 1; s < steps; ++s) launch_whole_step(args, launch, stream, 1);
  const std::size_t smem = shared_bytes(args.batch, args.dims[0], args.dims[args.layers - 1], args.dims[args.layers]);
  if (launch.cluster) {
    cudaLaunchAttribute attr{};
    const cudaLaunchConfig_t cfg = cluster_config(launch.blocks, smem, stream, attr);
    SG_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel_for<true>(args.batch, args.activation), args));
    return;
  }
  void* params[] = {const_cast<WholeStepArgs*>(&args)};
  SG_CUDA_CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel_for<false>(args.batch, args.activation)),
                                            dim3(unsigned(launch.blocks)), dim3(kBlockThreads), params, smem, stream));
}

}  // namespace sg::cuda
