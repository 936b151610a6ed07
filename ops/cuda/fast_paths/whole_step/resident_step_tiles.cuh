#pragma once
// The resident-step kernel's block shape and its tensor-core pieces
// (resident_step.cu, which alone includes this, through
// resident_step_phases.cuh): mma.m16n8k16 on operands in shared memory, the
// forward's split-K tiles, the input gradient pushed to its owners, the
// owned weight rows' updates. In an unnamed namespace, as they were in the
// kernel's own file: each has its callers in that one translation unit.
#include <cooperative_groups.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "ops/cuda/kernels.hpp"
#include "ops/cuda/mma_fragments.cuh"
#include "ops/cuda/sgd_step.cuh"

namespace sg::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kWarps = 8;
constexpr int kBlockThreads = kWarps * 32;

__device__ int warp_index() { return threadIdx.x / 32; }
__device__ int lane_index() { return threadIdx.x % 32; }

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
                                  int K, const UpdateScalars& s) {
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
        *w = __floats2half2_rn(sgd_step_folded(v.x, acc[n][2 * h], s), sgd_step_folded(v.y, acc[n][2 * h + 1], s));
      }
  }
}

}  // namespace
}  // namespace sg::cuda
