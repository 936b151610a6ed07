#pragma once
// A layer's weight gradient with its Adam/AdamW update in the epilogue (issue
// 21): for dY [batch, N] and X [batch, K] (fp16), each block computes a
// 64 x 64 tile of G = dY^T X on tensor cores (fp32 accumulation), rounds it
// to the matmul output's type G (as the buffered path's matmul writes it),
// and applies Adam to that tile of W [N, K] and its moments m, v (fp32)
// through the same device function as the multi-tensor update
// (adam_step.cuh). The gradient never goes through memory: one read and
// write of W, m and v. Bias correction from the device step counter
// (t = *step + 1); no clipping (the clip scale needs every gradient first).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "ops/cuda/kernels.hpp"
#include "ops/cuda/optimizer_kernels.hpp"

namespace sg::cuda {

// Empty when launch_wgrad_adam takes these sizes, else why not (N and K
// multiples of 8: 16-byte rows).
std::string wgrad_adam_unsupported(std::int64_t batch, std::int64_t n, std::int64_t k);

// W: float or __half; G (the gradient's rounding): __half or float (the
// scheduler uses <float, __half>, fp32 master weights: wgrad_adam.cpp says
// where it measured faster than the buffered path). Every
// pointer 16-byte aligned. `dependent`: a programmatic dependent launch
// (dependent_launch.cuh: W, m and v are read before the wait, dY and X after).
template <typename W, typename G>
void launch_wgrad_adam(const __half* dy, const __half* x, std::int64_t batch, std::int64_t n, std::int64_t k, W* w,
                       float* m, float* v, const SgdScalars* scalars, const std::int32_t* step, AdamHyper hyper,
                       cudaStream_t stream, bool dependent = false);

}  // namespace sg::cuda
