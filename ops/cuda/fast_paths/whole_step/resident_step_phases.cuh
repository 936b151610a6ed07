#pragma once
// The resident-step kernel's phases (resident_step.cu, which alone includes
// this): the carve of a block's shared memory, the copies between global and
// shared memory (parameters, the prefetched batch), and the element-wise
// pieces: the all-gather of a hidden layer's columns, the forward epilogue,
// the partial logits and softmax cross-entropy, the input gradient's
// reduction, the classifier and bias updates. In an unnamed namespace, as
// they were in the kernel's own file.
#include <cooperative_groups.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "ops/cuda/async_copy.cuh"
#include "ops/cuda/fast_paths/whole_step/resident_step.hpp"
#include "ops/cuda/fast_paths/whole_step/resident_step_tiles.cuh"
#include "ops/cuda/fast_paths/whole_step/step_common.cuh"
#include "ops/cuda/fast_paths/whole_step/whole_step.hpp"
#include "ops/cuda/sgd_step.cuh"
#include "ops/cuda/softmax_row.cuh"
#include "ops/cuda/warp_reduce.cuh"

namespace sg::cuda {
namespace {

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
    out[r * ld + col0 + j] = forward_epilogue<A>(s, bias[j], pre, r * ld_pre + j);
  }
  __syncthreads();
}

// b[j] = sgd(b[j], sum over the batch of grad[b][j]) for the owned entries.
template <int B>
__device__ void update_owned_bias(const __half* grad, int ldg, __half* bias, int J, const UpdateScalars& s) {
  for (int j = threadIdx.x; j < J; j += blockDim.x) {
    float g = 0.f;
#pragma unroll
    for (int r = 0; r < B; ++r) g += __half2float(grad[r * ldg + j]);
    bias[j] = __float2half(sgd_step_folded(__half2float(bias[j]), g, s));
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
__device__ void classifier_sgd(const Carve& c, int ld, int J, int C, const UpdateScalars& ws, const UpdateScalars& bs) {
  for (int e = threadIdx.x; e < C * J; e += blockDim.x) {
    const int cls = e / J, j = e % J;
    float g = 0.f;
#pragma unroll
    for (int r = 0; r < B; ++r) g += __half2float(c.dlogits[r * C + cls]) * __half2float(c.h_last[r * ld + j]);
    c.w_last[e] = __float2half(sgd_step_folded(__half2float(c.w_last[e]), g, ws));
  }
  // (the bias on the block's last threads, beside the weights on its first)
  for (int cls = int(blockDim.x) - 1 - int(threadIdx.x); cls >= 0 && cls < C; cls -= int(blockDim.x)) {
    float g = 0.f;
#pragma unroll
    for (int r = 0; r < B; ++r) g += __half2float(c.dlogits[r * C + cls]);
    c.b_last[cls] = __float2half(sgd_step_folded(__half2float(c.b_last[cls]), g, bs));
  }
}

}  // namespace
}  // namespace sg::cuda
