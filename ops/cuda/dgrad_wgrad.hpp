#pragma once
// One layer's backward in ONE pass over its weights, for a small batch: for
// W[N,K], the gradient dY[B,N] of the layer's pre-activation and its input
// X[B,K] (a ReLU output),
//   dX = (dY W) * (X > 0)                    (the previous layer's gradient)
//   W  = (1 - lr*wd) W - lr dY^T X           (plain SGD, in place)
// cuBLASLt needs two passes (a dgrad reading W, then a weight-gradient
// matmul reading and writing it); with a batch of 32 both are bound by
// memory traffic, so one pass saves a third of it. Tensor cores (wmma),
// fp32 accumulation, fp16 results rounded once, as the cuBLASLt calls round.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "ops/cuda/kernels.hpp"

namespace sg::cuda {

// Empty when the kernel runs these sizes, else why not.
std::string dgrad_wgrad_unsupported(std::int64_t batch, std::int64_t n, std::int64_t k);

// Sets the kernel's shared-memory limit for these sizes: call once before the
// first launch, outside stream capture.
void prepare_dgrad_wgrad_sgd(std::int64_t batch, std::int64_t k);
// With bias set, the kernel also applies SGD to the previous layer's bias
// from the column sums of dx (its gradient): b = (1 - lr*wd) b - lr colsum(dx).
void launch_dgrad_wgrad_sgd(const __half* dy, const __half* x, std::int64_t batch, std::int64_t n, std::int64_t k,
                            __half* w, __half* dx, const SgdScalars* scalars, cudaStream_t stream,
                            __half* bias = nullptr, const SgdScalars* bias_scalars = nullptr);

}  // namespace sg::cuda
