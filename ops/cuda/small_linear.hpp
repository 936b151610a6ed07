#pragma once
// Matmuls with one tiny dimension (the classifier layer: N or M = the number
// of classes): cuBLASLt tiles them badly (one CTA walking all of K), so these
// kernels spread the work over many warps/threads (or, for the forward of
// many rows, 16-row tensor-core tiles over a cluster) instead. Same contracts
// and fp16 rounding points as the cuBLASLt calls they replace; each is a
// dependent launch (dependent_launch.cuh) when `dependent` is set.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/activation.hpp"
#include "ops/cuda/kernels.hpp"

namespace sg::cuda {

// Largest tiny dimension these kernels take.
constexpr std::int64_t kSmallLinearMaxDim = 32;

// From this many rows (batch 256/1024) the forward runs on tensor cores.
constexpr std::int64_t kTensorCoreMinRows = 64;

// y[M,N] = x[M,K] w[N,K]^T + bias[N] (N <= kSmallLinearMaxDim): one warp per
// output, or, with `tensor_cores` (BackendOptions::classifier_mma) where
// linear_small_n_on_tensor_cores(), 16-row tiles on tensor cores with K
// split over a cluster. linear_small_n_on_tensor_cores: the sizes, operand
// alignment aside, and the GPU (Hopper) allow the tensor-core kernel.
bool linear_small_n_on_tensor_cores(std::int64_t m, std::int64_t n, std::int64_t k);
// The sizes part of that (no device asked).
bool linear_small_n_tiles_fit(std::int64_t m, std::int64_t n, std::int64_t k);
// The forward's input as the kernels load it: x itself, or (`on`) the
// activation of x, each element rounded to fp16 as the element-wise kernel
// rounds it, and written to `activated` [M,K] where that is not null (each
// element is loaded once by one lane): a lone activation before the
// classifier (an MLP's last GELU, SiLU, tanh or sigmoid, which cuBLASLt's
// epilogues do not compute) without a launch of its own. Meant for the
// tensor-core tiles, where each lane applies it to a few elements; a warp per
// output applies it to its whole row, each of the N warps of a row again (at
// 32 x 2048 -> 10, SiLU: 3.5 us slower than the element-wise launch).
struct InputActivation {
  bool on = false;
  Activation activation = Activation::relu;
  __half* activated = nullptr;
};
void launch_linear_small_n(const __half* x, const __half* w, const __half* bias, std::int64_t m, std::int64_t n,
                           std::int64_t k, __half* y, cudaStream_t stream, bool dependent, bool tensor_cores,
                           InputActivation input = {});

// Fused-SGD weight gradient with few output rows: w[M,K] = one_minus_lr_wd * w
// + neg_lr * (dy[B,M]^T x[B,K]) (M <= kSmallLinearMaxDim), a thread per column of W
// for each of 8 chains of batch rows.
template <typename W>
void launch_wgrad_sgd_small_m(const __half* dy, const __half* x, std::int64_t batch, std::int64_t m, std::int64_t k,
                              W* w, const UpdateScalars* scalars, cudaStream_t stream, bool dependent);

// dx[M,N] = act'(dy[M,K] w[K,N]) with K <= kSmallLinearMaxDim: the classifier
// layer's dgrad through the activation before it, a thread per 8 outputs of a
// row, rounded to fp16 once. `saved` [M,N] is what the activation's backward
// reads (activation.hpp): the forward output for relu, tanh and sigmoid (for
// ReLU: dx = s * (relu_out > 0)), the pre-activation for gelu, gelu_tanh, silu.
void launch_dgrad_activation_small_k(Activation activation, const __half* dy, const __half* w, const __half* saved,
                                     std::int64_t m, std::int64_t n, std::int64_t k, __half* dx, cudaStream_t stream,
                                     bool dependent);
inline void launch_dgrad_relu_small_k(const __half* dy, const __half* w, const __half* relu_out, std::int64_t m,
                                      std::int64_t n, std::int64_t k, __half* dx, cudaStream_t stream, bool dependent) {
  launch_dgrad_activation_small_k(Activation::relu, dy, w, relu_out, m, n, k, dx, stream, dependent);
}

}  // namespace sg::cuda
