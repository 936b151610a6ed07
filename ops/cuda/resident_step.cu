// Training steps with the weights resident in one cluster's shared memory
// (see resident_step.hpp). Per step, with L layers (l = 0 .. L-2 hidden,
// L-1 the classifier) and a cluster barrier after each line but the last:
//   F_l (l < L-2)  fetch (l = 0); own columns of act[l]; all-gather them
//   F_{L-2}        own columns of the last hidden output; partial logits to
//                  every block
//   loss + B_{L-2} logits, softmax-xent, classifier and last-bias SGD, own
//                  gradient columns; partial dX to its owners; W_{L-2} SGD
//   B_l (l >= 1)   own gradient columns from the partials; partial dX to
//                  its owners; W_l SGD
//   B_0            own gradient columns; W_0 SGD (no barrier: nothing remote
//                  is read or written until the next step's first barrier)
// Buffers written by other blocks are reused only after a barrier that
// every reader of the old contents has passed; the two exchange buffers
// alternate between consecutive dgrad layers for that reason.
#include <cooperative_groups.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cfloat>
#include <cstdlib>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ops/cuda/activation.cuh"
#include "ops/cuda/async_copy.cuh"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/kernel_limits.hpp"
#include "ops/cuda/mma_fragments.cuh"
#include "ops/cuda/resident_step.hpp"
#include "ops/cuda/softmax_row.cuh"
#include "ops/cuda/whole_step.hpp"

namespace sg::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

// The block's shared memory, carved as the layout says.
struct Carve {
  __half* x;                          // [B][x_stride] the batch
  __half* w[kResidentMaxLayers];      // [J_l][w_stride] owned rows of W_l
  __half* b[kResidentMaxLayers];      // [J_l] owned entries of b_l
  __half* act[kResidentMaxLayers];    // [B][act_stride] gathered hidden outputs (l < L-2)
  __half* w_last;                     // [C][J] owned columns of the classifier's weight
  __half* b_last;                     // [C] the classifier's bias (every block keeps a copy)
  __half* h_last;                     // [B][own_stride] own columns of the last hidden output
  __half* grad;                       // [B][own_stride] own columns of dloss/dpre-activation
  float* exchange[2];                 // [S][B][J] partial dX from each block (also scratch)
  __half* logits;                     // [B][C]
  __half* dlogits;                    // [B][C]
  float* logits_partial;              // [B][C] this block's share of the logits
  float* row_loss;                    // [B]
  int* labels;                        // [B] the batch's labels
  std::uint8_t* staging;              // [B][dims[0]] the next batch's raw pixels (cp.async)
  int* labels_next;                   // [B]
};

__device__ Carve carve(const ResidentLayout& lay, unsigned char* base, int hidden) {
  Carve c{};
  c.x = reinterpret_cast<__half*>(base + lay.x);
  for (int l = 0; l < hidden; ++l) {
    c.w[l] = reinterpret_cast<__half*>(base + lay.w[l]);
    c.b[l] = reinterpret_cast<__half*>(base + lay.b[l]);
    c.act[l] = reinterpret_cast<__half*>(base + lay.act[l]);
  }
  c.w_last = reinterpret_cast<__half*>(base + lay.w_last);
  c.b_last = reinterpret_cast<__half*>(base + lay.b_last);
  c.h_last = reinterpret_cast<__half*>(base + lay.h_last);
  c.grad = reinterpret_cast<__half*>(base + lay.grad);
  c.exchange[0] = reinterpret_cast<float*>(base + lay.exchange[0]);
  c.exchange[1] = reinterpret_cast<float*>(base + lay.exchange[1]);
  c.logits = reinterpret_cast<__half*>(base + lay.logits);
  c.dlogits = reinterpret_cast<__half*>(base + lay.dlogits);
  c.logits_partial = reinterpret_cast<float*>(base + lay.logits_partial);
  c.row_loss = reinterpret_cast<float*>(base + lay.row_loss);
  c.labels = reinterpret_cast<int*>(base + lay.labels);
  c.staging = base + lay.staging;
  c.labels_next = reinterpret_cast<int*>(base + lay.labels_next);
  return c;
}

__device__ int warp_index() { return threadIdx.x / 32; }
__device__ int lane_index() { return threadIdx.x % 32; }

// PyTorch SGD without momentum as the other lowerings compute it.
__device__ float sgd(float w, float g, const SgdScalars& s) { return s.neg_lr * g + s.one_minus_lr_wd * w; }

// ---- global <-> shared -------------------------------------------------------

// rows x cols halves (cols a multiple of 8) between a global matrix with
// leading dimension ld_global and a shared one with ld_shared.
__device__ void copy_rows_in(__half* dst, int ld_shared, const __half* src, std::int64_t ld_global, int rows, int cols) {
  const int vectors = cols / 8;
  for (int e = threadIdx.x; e < rows * vectors; e += blockDim.x) {
    const int r = e / vectors, c = (e % vectors) * 8;
    *reinterpret_cast<uint4*>(dst + r * ld_shared + c) = *reinterpret_cast<const uint4*>(src + r * ld_global + c);
  }
}
__device__ void copy_rows_out(__half* dst, std::int64_t ld_global, const __half* src, int ld_shared, int rows, int cols) {
  const int vectors = cols / 8;
  for (int e = threadIdx.x; e < rows * vectors; e += blockDim.x) {
    const int r = e / vectors, c = (e % vectors) * 8;
    *reinterpret_cast<uint4*>(dst + r * ld_global + c) = *reinterpret_cast<const uint4*>(src + r * ld_shared + c);
  }
}

// Queues the batch of dataset step `step` (rows perm[(step mod (rows/B))*B + i])
// into the staging buffer as raw pixels, 16 per cp.async, and its labels
// into labels_next; take_batch finishes it. Issued a step ahead, so the
// dependent loads (permutation, then rows) stay off the critical path.
template <int B>
__device__ void prefetch_batch(const WholeStepArgs& a, const Carve& c, std::int64_t step) {
  const int cols = a.dims[0], chunks = cols / 16;
  const std::int64_t base = (step % (a.rows / B)) * B;
  for (int e = threadIdx.x; e < B * chunks; e += blockDim.x) {
    const int r = e / chunks, col = (e % chunks) * 16;
    const std::int64_t row = a.perm[base + r];
    copy_async16(shared_address(c.staging + r * cols + col), a.images + row * cols + col);
    if (col == 0) c.labels_next[r] = a.labels[row];
  }
  commit_copies();
}

// The prefetched batch, scaled as the batch_fetch kernel scales it, into x.
template <int B>
__device__ void take_batch(const WholeStepArgs& a, const ResidentLayout& lay, const Carve& c) {
  wait_copies<0>();
  __syncthreads();
  const int cols = a.dims[0], chunks = cols / 16;
  for (int e = threadIdx.x; e < B * chunks; e += blockDim.x) {
    const int r = e / chunks, col = (e % chunks) * 16;
    const uint4 packed = *reinterpret_cast<const uint4*>(c.staging + r * cols + col);
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(&packed);
    uint4 out[2];
    auto* h = reinterpret_cast<__half2*>(out);
#pragma unroll
    for (int k = 0; k < 8; ++k)
      h[k] = __floats2half2_rn(float(bytes[2 * k]) * a.scale + a.shift, float(bytes[2 * k + 1]) * a.scale + a.shift);
    auto* dst = reinterpret_cast<uint4*>(c.x + r * lay.x_stride + col);
    dst[0] = out[0];
    dst[1] = out[1];
  }
  for (int i = threadIdx.x; i < B; i += blockDim.x) c.labels[i] = c.labels_next[i];
  __syncthreads();
}

// ---- tensor-core pieces ------------------------------------------------------

// acc[m][n] += rows m*16.. of A (k-step ks, row-major [B][lda]) times the
// two 8-column n-tiles held in b, for every 16-row tile m of the batch.
template <int B>
__device__ void mma_batch_rows(float (&acc)[B / 16][2][4], const __half* A, int lda, int ks, const std::uint32_t (&b)[4]) {
  const int lane = lane_index(), quad = lane / 8;
#pragma unroll
  for (int m = 0; m < B / 16; ++m) {
    std::uint32_t a[4];
    load_matrices(a, shared_address(A + (m * 16 + (quad % 2) * 8 + lane % 8) * lda + ks * 16 + (quad / 2) * 8));
    mma_16x8x16(acc[m][0], a, b[0], b[1]);
    mma_16x8x16(acc[m][1], a, b[2], b[3]);
  }
}

// partial[warp][b][j] = sum over the warp's k-steps of A[b][k] W[j][k]:
// out[B][J] = A W^T with the K/16 k-steps split over the warps. A: [B][lda],
// W: [J][ldw] (owned rows), both in shared memory.
template <int B>
__device__ void rows_times_owned_rows(const __half* A, int lda, const __half* W, int ldw, int K, int J,
                                      float* partial) {
  constexpr int kMTiles = B / 16;
  const int warp = warp_index(), lane = lane_index(), quad = lane / 8, g = lane / 4, t = lane % 4;
  for (int np = 0; np < J / 16; ++np) {
    float acc[kMTiles][2][4] = {};
#pragma unroll 2
    for (int ks = warp; ks < K / 16; ks += kWarps) {
      std::uint32_t b[4];  // n-tiles np*16 and np*16+8, k halves 0 and 8
      load_matrices(b, shared_address(W + (np * 16 + (quad / 2) * 8 + lane % 8) * ldw + ks * 16 + (quad % 2) * 8));
      mma_batch_rows<B>(acc, A, lda, ks, b);
    }
#pragma unroll
    for (int m = 0; m < kMTiles; ++m)
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        float* p = partial + (warp * B + m * 16 + g) * J + np * 16 + n * 8 + 2 * t;
        *reinterpret_cast<float2*>(p) = make_float2(acc[m][n][0], acc[m][n][1]);
        *reinterpret_cast<float2*>(p + 8 * J) = make_float2(acc[m][n][2], acc[m][n][3]);
      }
  }
}

// The input gradient's partial sum over this block's J gradient columns,
// dX[b][k] = sum_j grad[b][j] W[j][k], stored (fp32) into the block that owns
// column k: its exchange buffer, slot `me`, as [B][J_prev].
template <int B>
__device__ void push_input_gradient(cg::cluster_group& cluster, const __half* grad, int ldg, const __half* W, int ldw,
                                    int J, int K, int J_prev, float* exchange, int me) {
  constexpr int kMTiles = B / 16;
  const int warp = warp_index(), lane = lane_index(), quad = lane / 8, g = lane / 4, t = lane % 4;
  for (int np = warp; np < K / 16; np += kWarps) {
    float acc[kMTiles][2][4] = {};
    for (int ks = 0; ks < J / 16; ++ks) {
      std::uint32_t b[4];  // W rows are k of this product: transposed loads
      load_matrices_transposed(b, shared_address(W + (ks * 16 + (quad % 2) * 8 + lane % 8) * ldw + np * 16 + (quad / 2) * 8));
      mma_batch_rows<B>(acc, grad, ldg, ks, b);
    }
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const int k = np * 16 + n * 8 + 2 * t, owner = k / J_prev, col = k % J_prev;
      float* remote = cluster.map_shared_rank(exchange, owner) + std::size_t(me) * B * J_prev + col;
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
        *reinterpret_cast<float2*>(remote + (m * 16 + g) * J_prev) = make_float2(acc[m][n][0], acc[m][n][1]);
        *reinterpret_cast<float2*>(remote + (m * 16 + g + 8) * J_prev) = make_float2(acc[m][n][2], acc[m][n][3]);
      }
    }
  }
}

// sum_b grad[b][j] A[b][k] for one 16 x 16 tile (rows mj*16.., columns
// np*16..) in the mma accumulator layout; both operands are stored
// batch-major, so both load transposed.
template <int B>
__device__ void weight_gradient_tile(const __half* grad, int ldg, const __half* A, int lda, int mj, int np,
                                     float (&acc)[2][4]) {
  const int lane = lane_index(), quad = lane / 8;
#pragma unroll
  for (int kb = 0; kb < B / 16; ++kb) {
    std::uint32_t a[4], b[4];
    load_matrices_transposed(a, shared_address(grad + (kb * 16 + (quad / 2) * 8 + lane % 8) * ldg + mj * 16 + (quad % 2) * 8));
    load_matrices_transposed(b, shared_address(A + (kb * 16 + (quad % 2) * 8 + lane % 8) * lda + np * 16 + (quad / 2) * 8));
    mma_16x8x16(acc[0], a, b[0], b[1]);
    mma_16x8x16(acc[1], a, b[2], b[3]);
  }
}

// W[j][k] = sgd(W[j][k], sum_b grad[b][j] A[b][k]) for the owned rows: a warp
// per 16 x 16 tile; the gradient never leaves the registers.
template <int B>
__device__ void update_owned_rows(const __half* grad, int ldg, const __half* A, int lda, __half* W, int ldw, int J,
                                  int K, const SgdScalars& s) {
  const int warp = warp_index(), lane = lane_index(), g = lane / 4, t = lane % 4;
  const int pairs = K / 16;
  for (int tile = warp; tile < (J / 16) * pairs; tile += kWarps) {
    const int mj = tile / pairs, np = tile % pairs;
    float acc[2][4] = {};
    weight_gradient_tile<B>(grad, ldg, A, lda, mj, np, acc);
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        auto* w = reinterpret_cast<__half2*>(W + (mj * 16 + g + 8 * h) * ldw + np * 16 + n * 8 + 2 * t);
        const float2 v = __half22float2(*w);
        *w = __floats2half2_rn(sgd(v.x, acc[n][2 * h], s), sgd(v.y, acc[n][2 * h + 1], s));
      }
  }
}

// ---- element-wise pieces -----------------------------------------------------

// Copies this block's [B][J] columns (at column col0 of a [B][ld] buffer)
// into the same place of every other block of the cluster.
template <int B>
__device__ void all_gather_columns(cg::cluster_group& cluster, __half* buffer, int ld, int col0, int J, int me, int S) {
  const int vectors = J / 8, per_block = B * vectors;
  for (int e = threadIdx.x; e < (S - 1) * per_block; e += blockDim.x) {
    const int peer = (me + 1 + e / per_block) % S, r = (e % per_block) / vectors, c = col0 + (e % vectors) * 8;
    const uint4 v = *reinterpret_cast<const uint4*>(buffer + r * ld + c);
    *reinterpret_cast<uint4*>(cluster.map_shared_rank(buffer, peer) + r * ld + c) = v;
  }
}

// Sums the warps' partial [B][J] tiles, adds the bias, applies the
// activation and stores fp16 at out[b][col0 + j]. Where the activation's
// backward reads its input, the pre-activation goes to pre[b][j] (own columns).
template <int B, Activation A>
__device__ void finish_forward(const float* partial, const __half* bias, __half* out, int ld, int col0, int J,
                               __half* pre, int ld_pre) {
  __syncthreads();
  for (int e = threadIdx.x; e < B * J; e += blockDim.x) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += partial[w * B * J + e];
    const int r = e / J, j = e % J;
    if constexpr (A == Activation::relu) {  // (the epilogue this kernel always had)
      out[r * ld + col0 + j] = __float2half(fmaxf(s + __half2float(bias[j]), 0.f));
    } else {
      // act(z) of z rounded to fp16, as the whole-step and small-batch forwards compute it
      const __half z = __float2half(s + __half2float(bias[j]));
      if constexpr (kBackwardReadsInput<A>) pre[r * ld_pre + j] = z;
      out[r * ld + col0 + j] = __float2half(ActivationMath<A>::forward(__half2float(z)));
    }
  }
  __syncthreads();
}

// The activation's backward of the fp32 sum s given the saved fp16 value v
// (output or pre-activation), rounded once to fp16 as the whole-step kernel does.
template <Activation A>
__device__ __half activation_backward(float s, __half v) {
  if constexpr (A == Activation::relu)  // (the select this kernel always made: the ReLU instance is unchanged)
    return __half2float(v) > 0.f ? __float2half(s) : __float2half(0.f);
  else
    return __float2half(ActivationMath<A>::backward(s, __half2float(v)));
}

// b[j] = sgd(b[j], sum over the batch of grad[b][j]) for the owned entries.
template <int B>
__device__ void update_owned_bias(const __half* grad, int ldg, __half* bias, int J, const SgdScalars& s) {
  for (int j = threadIdx.x; j < J; j += blockDim.x) {
    float g = 0.f;
#pragma unroll
    for (int r = 0; r < B; ++r) g += __half2float(grad[r * ldg + j]);
    bias[j] = __float2half(sgd(__half2float(bias[j]), g, s));
  }
}

// grad[b][j] = act'(sum over the blocks' partials) given the saved value
// saved[b][col0 + j]: for ReLU the mask (the layer's output > 0; the DRELU
// epilogue's rounding).
template <int B, Activation A>
__device__ void reduce_input_gradient(const float* exchange, int S, const __half* saved, int lds, int col0,
                                      __half* grad, int ldg, int J) {
  for (int e = threadIdx.x; e < B * J; e += blockDim.x) {
    float s = 0.f;
#pragma unroll 8
    for (int src = 0; src < S; ++src) s += exchange[src * B * J + e];
    const int r = e / J, j = e % J;
    grad[r * ldg + j] = activation_backward<A>(s, saved[r * lds + col0 + j]);
  }
}

// This block's share of the logits, [B][C] over its J columns, into every block.
template <int B>
__device__ void push_partial_logits(cg::cluster_group& cluster, const Carve& c, int ldh, int J, int C, float* slots,
                                    int me, int S) {
  for (int e = threadIdx.x; e < B * C; e += blockDim.x) {
    const int r = e / C, cls = e % C;
    float s = 0.f;
#pragma unroll 8
    for (int j = 0; j < J; ++j) s += __half2float(c.h_last[r * ldh + j]) * __half2float(c.w_last[cls * J + j]);
    c.logits_partial[e] = s;
  }
  __syncthreads();
  const int vectors = B * C / 4;  // B is a multiple of 16
  for (int e = threadIdx.x; e < S * vectors; e += blockDim.x) {
    const int peer = (me + e / vectors) % S, v = e % vectors;
    const float4 value = reinterpret_cast<const float4*>(c.logits_partial)[v];
    reinterpret_cast<float4*>(cluster.map_shared_rank(slots, peer) + std::size_t(me) * B * C)[v] = value;
  }
}

// The logits (rank-ordered sum of the partials plus bias, rounded to fp16),
// softmax cross-entropy and its gradient (softmax_row.cuh, as the xent
// kernel computes them); rank 0 stores the batch's mean loss.
template <int B>
__device__ void softmax_xent(const Carve& c, const float* slots, int S, int C, float* loss, bool store_loss) {
  for (int e = threadIdx.x; e < B * C; e += blockDim.x) {
    float s = 0.f;
#pragma unroll 8
    for (int src = 0; src < S; ++src) s += slots[src * B * C + e];
    c.logits[e] = __float2half(s + __half2float(c.b_last[e % C]));
  }
  __syncthreads();
#pragma unroll
  for (int r = warp_index(); r < B; r += kWarps) {
    const float row_loss = softmax_xent_row<__half>(c.logits + r * C, C, c.labels[r], 1.f / float(B), c.dlogits + r * C);
    if (lane_index() == 0) c.row_loss[r] = row_loss;
  }
  __syncthreads();
  if (store_loss && warp_index() == kWarps - 1) {  // (the loss is only reported: a warp sums it)
    float sum = 0.f;
    for (int r = lane_index(); r < B; r += 32) sum += c.row_loss[r];
    sum = warp_sum(sum);
    if (lane_index() == 0) *loss = sum * (1.f / float(B));
  }
}

// The last hidden layer's own gradient columns, through the classifier's
// (not yet updated) weights. The activation's backward reads h_last, or
// (gelu, gelu_tanh, silu) `pre`, the pre-activation's own columns ([B][ld]).
template <int B, Activation A>
__device__ void classifier_dgrad(const Carve& c, int ld, int J, int C, const __half* pre) {
  for (int e = threadIdx.x; e < B * J; e += blockDim.x) {
    const int r = e / J, j = e % J;
    float s = 0.f;
#pragma unroll 8
    for (int cls = 0; cls < C; ++cls) s += __half2float(c.dlogits[r * C + cls]) * __half2float(c.w_last[cls * J + j]);
    c.grad[r * ld + j] = activation_backward<A>(s, (kBackwardReadsInput<A> ? pre : c.h_last)[r * ld + j]);
  }
}

// The classifier's SGD: its owned weight columns, and its bias (every block
// keeps a copy; all compute the same bits).
template <int B>
__device__ void classifier_sgd(const Carve& c, int ld, int J, int C, const SgdScalars& ws, const SgdScalars& bs) {
  for (int e = threadIdx.x; e < C * J; e += blockDim.x) {
    const int cls = e / J, j = e % J;
    float g = 0.f;
#pragma unroll
    for (int r = 0; r < B; ++r) g += __half2float(c.dlogits[r * C + cls]) * __half2float(c.h_last[r * ld + j]);
    c.w_last[e] = __float2half(sgd(__half2float(c.w_last[e]), g, ws));
  }
  // (the bias on the block's last threads, beside the weights on its first)
  for (int cls = int(blockDim.x) - 1 - int(threadIdx.x); cls >= 0 && cls < C; cls -= int(blockDim.x)) {
    float g = 0.f;
#pragma unroll
    for (int r = 0; r < B; ++r) g += __half2float(c.dlogits[r * C + cls]);
    c.b_last[cls] = __float2half(sgd(__half2float(c.b_last[cls]), g, bs));
  }
}

__device__ void mark_phase(const WholeStepArgs& a, bool first_step, int& phase) {
  if (a.phase_clock && first_step && blockIdx.x == 0 && threadIdx.x == 0) {
    unsigned long long ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    a.phase_clock[phase] = ns;
  }
  ++phase;
}

// ---- the kernel --------------------------------------------------------------

// A: the hidden layers' activation.
template <int B, Activation A>
__global__ void __launch_bounds__(kThreads, 1)
    resident_steps_kernel(const __grid_constant__ WholeStepArgs a, const __grid_constant__ ResidentLayout lay, int steps) {
  // Everything indexed by a runtime layer number lives in shared memory or
  // the (__grid_constant__) parameters, never on the stack: with ~220 KB of
  // shared memory the L1 left for per-thread local memory is tiny, and a
  // stack would make every such access an L2 round trip.
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ Carve carved;
  __shared__ SgdScalars wsgd[kResidentMaxLayers], bsgd[kResidentMaxLayers];
  cg::cluster_group cluster = cg::this_cluster();
  const int L = a.layers, hidden = L - 1, C = a.dims[L], S = lay.cluster;
  const int me = int(cluster.block_rank());
  if (threadIdx.x == 0) carved = carve(lay, smem, hidden);
  for (int l = threadIdx.x; l < L; l += blockDim.x) {
    wsgd[l] = *a.weight_sgd[l];
    bsgd[l] = *a.bias_sgd[l];
  }
  __syncthreads();
  // A block may touch another's shared memory only once that block runs:
  // arrive now, wait before the first exchange (the loads below overlap it).
  cluster_arrive();
  const Carve& c = carved;
  // Own columns of hidden layer l's pre-activation (gelu, gelu_tanh, silu only).
  const auto pre = [&](int l) { return reinterpret_cast<__half*>(smem + lay.pre[l]); };
  const std::int64_t first_step = *a.step;
  const int J_last = lay.own[hidden - 1], ld_own = lay.own_stride;

  // Load the owned parameters.
  for (int l = 0; l < hidden; ++l) {
    const int J = lay.own[l], K = a.dims[l];
    copy_rows_in(c.w[l], lay.w_stride[l], a.weight[l] + std::int64_t(me) * J * K, K, J, K);
    for (int j = threadIdx.x; j < J; j += blockDim.x) c.b[l][j] = a.bias[l][me * J + j];
  }
  for (int e = threadIdx.x; e < C * J_last; e += blockDim.x)
    c.w_last[e] = a.weight[L - 1][std::int64_t(e / J_last) * a.dims[L - 1] + me * J_last + e % J_last];
  for (int cls = threadIdx.x; cls < C; cls += blockDim.x) c.b_last[cls] = a.bias[L - 1][cls];

  prefetch_batch<B>(a, c, first_step);
  cluster_wait();
  for (int s = 0; s < steps; ++s) {
    const bool first = s == 0;
    int phase = 0;
    mark_phase(a, first, phase);
    take_batch<B>(a, lay, c);  // (its first barrier: the last step's W_0 update read x)

    // Forward through the hidden layers.
    for (int l = 0; l < hidden; ++l) {
      const int J = lay.own[l];
      const __half* in = l == 0 ? c.x : c.act[l - 1];
      const int ld_in = l == 0 ? lay.x_stride : lay.act_stride[l - 1];
      rows_times_owned_rows<B>(in, ld_in, c.w[l], lay.w_stride[l], a.dims[l], J, c.exchange[0]);
      if (l + 1 < hidden) {
        finish_forward<B, A>(c.exchange[0], c.b[l], c.act[l], lay.act_stride[l], me * J, J, pre(l), ld_own);
        all_gather_columns<B>(cluster, c.act[l], lay.act_stride[l], me * J, J, me, S);
      } else {
        finish_forward<B, A>(c.exchange[0], c.b[l], c.h_last, ld_own, 0, J, pre(l), ld_own);
        push_partial_logits<B>(cluster, c, ld_own, J, C, c.exchange[1], me, S);
      }
      cluster_arrive();
      if (l == 0 && s + 1 < steps) prefetch_batch<B>(a, c, first_step + s + 1);  // the staging buffer is free
      cluster_wait();
      mark_phase(a, first, phase);
    }

    // Loss, then backward through the hidden layers; the gradient columns
    // of layer l are in c.grad. Between a barrier's arrive and its wait go
    // the updates that only touch this block's memory.
    softmax_xent<B>(c, c.exchange[1], S, C, a.loss, me == 0);
    classifier_dgrad<B, A>(c, ld_own, J_last, C, kBackwardReadsInput<A> ? pre(hidden - 1) : nullptr);
    __syncthreads();
    for (int l = hidden - 1; l >= 0; --l) {
      const int J = lay.own[l], K = a.dims[l];
      const __half* in = l == 0 ? c.x : c.act[l - 1];
      const int ld_in = l == 0 ? lay.x_stride : lay.act_stride[l - 1];
      float* exchange = c.exchange[(hidden - 1 - l) % 2];
      if (l >= 1) push_input_gradient<B>(cluster, c.grad, ld_own, c.w[l], lay.w_stride[l], J, K, lay.own[l - 1], exchange, me);
      // act[0] is rewritten by the next step's first all-gather, which only
      // this barrier separates from here: W_1's update reads it before arriving.
      const bool update_before_arrive = l == 1;
      if (l >= 1 && !update_before_arrive) cluster_arrive();
      if (l == hidden - 1) classifier_sgd<B>(c, ld_own, J_last, C, wsgd[L - 1], bsgd[L - 1]);
      update_owned_bias<B>(c.grad, ld_own, c.b[l], J, bsgd[l]);
      __syncthreads();  // W_l was read above
      update_owned_rows<B>(c.grad, ld_own, in, ld_in, c.w[l], lay.w_stride[l], J, K, wsgd[l]);
      if (l == 0) break;
      if (update_before_arrive) cluster_arrive();
      cluster_wait();
      __syncthreads();  // the wait orders arrivals, not the work after them: W_l's update read c.grad
      mark_phase(a, first, phase);
      const int J_prev = lay.own[l - 1];
      if constexpr (kBackwardReadsInput<A>)
        reduce_input_gradient<B, A>(exchange, S, pre(l - 1), ld_own, 0, c.grad, ld_own, J_prev);
      else
        reduce_input_gradient<B, A>(exchange, S, c.act[l - 1], lay.act_stride[l - 1], me * J_prev, c.grad, ld_own,
                                    J_prev);
      __syncthreads();
    }
    // With one hidden layer nothing else separates this step's reads of the
    // partial logits from the next step's writes.
    if (hidden == 1) cluster.sync();
    mark_phase(a, first, phase);
  }

  // Write the parameters back; the step counter advances by `steps`.
  __syncthreads();
  for (int l = 0; l < hidden; ++l) {
    const int J = lay.own[l], K = a.dims[l];
    copy_rows_out(a.weight[l] + std::int64_t(me) * J * K, K, c.w[l], lay.w_stride[l], J, K);
    for (int j = threadIdx.x; j < J; j += blockDim.x) a.bias[l][me * J + j] = c.b[l][j];
  }
  for (int e = threadIdx.x; e < C * J_last; e += blockDim.x)
    a.weight[L - 1][std::int64_t(e / J_last) * a.dims[L - 1] + me * J_last + e % J_last] = c.w_last[e];
  if (me == 0)
    for (int cls = threadIdx.x; cls < C; cls += blockDim.x) a.bias[L - 1][cls] = c.b_last[cls];
  cluster.sync();  // every block read the step counter long ago; no DSMEM access may outlive a block
  if (me == 0 && threadIdx.x == 0) *a.step = std::int32_t(first_step + steps);
}

using KernelFn = void (*)(WholeStepArgs, ResidentLayout, int);

KernelFn kernel_for(int batch, Activation activation) {
  return with_activation(activation, [&](auto act) -> KernelFn {
    constexpr Activation A = decltype(act)::value;
    switch (batch) {
      case 16: return resident_steps_kernel<16, A>;
      case 32: return resident_steps_kernel<32, A>;
      case 48: return resident_steps_kernel<48, A>;
      case 64: return resident_steps_kernel<64, A>;
    }
    throw CudaError(fmt::format("resident_steps_kernel: no instance for batch {}", batch));
  });
}

// The layout for a cluster of S blocks (bytes = 0 when the columns do not
// split into whole 16-wide tiles).
ResidentLayout layout_for(const WholeStepArgs& a, int S) {
  ResidentLayout lay;
  lay.cluster = S;
  const int hidden = a.layers - 1, B = a.batch, C = a.dims[a.layers];
  int j_max = 0;
  for (int l = 0; l < hidden; ++l) {
    if (a.dims[l + 1] % (16 * S) != 0) return {};
    lay.own[l] = a.dims[l + 1] / S;
    lay.w_stride[l] = a.dims[l] + 8;
    lay.act_stride[l] = a.dims[l + 1] + 8;
    j_max = std::max(j_max, lay.own[l]);
  }
  lay.x_stride = a.dims[0] + 8;
  lay.own_stride = j_max + 8;
  std::size_t off = 0;
  auto take = [&](std::size_t bytes) {
    const std::size_t at = off;
    off = (off + bytes + 127) / 128 * 128;
    return at;
  };
  lay.x = take(std::size_t(B) * lay.x_stride * 2);
  for (int l = 0; l < hidden; ++l) {
    lay.w[l] = take(std::size_t(lay.own[l]) * lay.w_stride[l] * 2);
    lay.b[l] = take(std::size_t(lay.own[l]) * 2);
    if (l + 1 < hidden) lay.act[l] = take(std::size_t(B) * lay.act_stride[l] * 2);
  }
  const int j_last = lay.own[hidden - 1];
  lay.w_last = take(std::size_t(C) * j_last * 2);
  lay.b_last = take(std::size_t(C) * 2);
  lay.h_last = take(std::size_t(B) * lay.own_stride * 2);
  lay.grad = take(std::size_t(B) * lay.own_stride * 2);
  // exchange[0]: partial dX, and the forward's split-K partials; exchange[1]:
  // partial dX, and the partial logits (see the kernel for why these share).
  const std::size_t dx = std::size_t(S) * B * j_max * 4;
  lay.exchange[0] = take(std::max(dx, std::size_t(kWarps) * B * j_max * 4));
  lay.exchange[1] = take(std::max(dx, std::size_t(S) * B * C * 4));
  lay.logits = take(std::size_t(B) * C * 2);
  lay.dlogits = take(std::size_t(B) * C * 2);
  lay.logits_partial = take(std::size_t(B) * C * 4);
  lay.row_loss = take(std::size_t(B) * 4);
  lay.labels = take(std::size_t(B) * 4);
  lay.staging = take(std::size_t(B) * a.dims[0]);
  lay.labels_next = take(std::size_t(B) * 4);
  if (backward_reads_input(a.activation))  // (after the rest: the ReLU layout is the one it always was)
    for (int l = 0; l < hidden; ++l) lay.pre[l] = take(std::size_t(B) * lay.own_stride * 2);
  lay.bytes = off;
  return lay;
}

// Dynamic shared memory a block may have next to the kernel's static share.
std::size_t dynamic_shared_limit(int batch, Activation activation) {
  cudaFuncAttributes attr{};
  SG_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel_for(batch, activation)));
  return std::size_t(current_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin)) - attr.sharedSizeBytes;
}

cudaLaunchConfig_t cluster_config(const ResidentLayout& lay, cudaStream_t stream, cudaLaunchAttribute& attr) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(lay.cluster));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = lay.bytes;
  cfg.stream = stream;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = unsigned(lay.cluster);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return cfg;
}

// Whether one cluster of this layout fits on the GPU (sets the attributes it needs).
bool cluster_fits(const WholeStepArgs& a, const ResidentLayout& lay) {
  const KernelFn kernel = kernel_for(a.batch, a.activation);
  // The most any layout may ask for: trainers of different widths share the kernel.
  SG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     int(dynamic_shared_limit(a.batch, a.activation))));
  SG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  cudaLaunchAttribute attr{};
  const cudaLaunchConfig_t cfg = cluster_config(lay, nullptr, attr);
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) == cudaSuccess && clusters > 0) return true;
  (void)cudaGetLastError();  // a refused size is an answer, not an error
  return false;
}

// Sizes the kernel's code does not handle, whatever the cluster.
std::string shape_unsupported(const WholeStepArgs& a) {
  if (a.layers < 2 || a.layers > kResidentMaxLayers) return fmt::format("{} layers (2..{} supported)", a.layers, kResidentMaxLayers);
  if (a.batch != 16 && a.batch != 32 && a.batch != 48 && a.batch != 64) return fmt::format("batch {}", a.batch);
  if (a.dims[0] % 16 != 0) return fmt::format("input width {} is not a multiple of 16", a.dims[0]);
  if (a.dims[a.layers] > kWholeStepMaxClasses) return fmt::format("{} classes", a.dims[a.layers]);
  if (a.rows < a.batch) return "fewer dataset rows than one batch";
  if (current_device_attribute(cudaDevAttrComputeCapabilityMajor) < 9) return "thread-block clusters need compute capability 9.0";
  return {};
}

// Cluster sizes to try, largest first (0), or the one asked for.
std::vector<int> cluster_candidates(int cluster) {
  if (cluster == 0) return {kResidentClusterSizes.begin(), kResidentClusterSizes.end()};
  if (std::find(kResidentClusterSizes.begin(), kResidentClusterSizes.end(), cluster) == kResidentClusterSizes.end())
    throw CudaError(fmt::format("resident steps: cluster size {} (0 or one of {})", cluster,
                                fmt::join(kResidentClusterSizes, ", ")));
  return {cluster};
}

}  // namespace

std::string resident_step_unsupported(const WholeStepArgs& a, int cluster) {
  if (auto why = shape_unsupported(a); !why.empty()) return why;
  for (int S : cluster_candidates(cluster)) {
    const ResidentLayout lay = layout_for(a, S);
    if (lay.bytes && lay.bytes <= dynamic_shared_limit(a.batch, a.activation) && cluster_fits(a, lay)) return {};
  }
  return cluster ? fmt::format("a cluster of {} does not hold the weights in shared memory", cluster)
                 : "no cluster holds the weights in shared memory";
}

ResidentLayout plan_resident_layout(const WholeStepArgs& a, int cluster) {
  if (auto why = shape_unsupported(a); !why.empty()) throw CudaError("resident steps: " + why);
  for (int S : cluster_candidates(cluster)) {
    const ResidentLayout lay = layout_for(a, S);
    if (lay.bytes && lay.bytes <= dynamic_shared_limit(a.batch, a.activation) && cluster_fits(a, lay)) return lay;
  }
  throw CudaError("resident steps: no cluster holds the weights in shared memory");
}

void launch_resident_steps(const WholeStepArgs& args, const ResidentLayout& layout, int steps, cudaStream_t stream) {
  if (steps < 1) throw CudaError("resident_steps_kernel: launched for no steps");
  cudaLaunchAttribute attr{};
  const cudaLaunchConfig_t cfg = cluster_config(layout, stream, attr);
  SG_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel_for(args.batch, args.activation), args, layout, steps));
}

std::vector<std::string> resident_step_phase_names(int layers) {
  std::vector<std::string> names;
  const int hidden = layers - 1;
  for (int l = 0; l < hidden; ++l) {
    std::string name = l == 0 ? "fetch + layer 1 forward" : fmt::format("layer {} forward", l + 1);
    names.push_back(l + 1 < hidden ? name + " + all-gather" : name + " + partial logits");
  }
  for (int l = hidden - 1; l >= 0; --l) {
    std::string name = l == hidden - 1 ? fmt::format("softmax-xent + layer {} SGD + ", layers) : std::string();
    name += l >= 1 ? fmt::format("layer {} dgrad + SGD", l + 1) : "layer 1 SGD";
    names.push_back(name);
  }
  return names;
}

}  // namespace sg::cuda
