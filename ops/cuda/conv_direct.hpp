#pragma once
// The direct path of our convolutions (conv_implicit_gemm.hpp says when it
// runs): one block per image (x a group of output channels) with the
// image's input planes and its filters staged in shared memory; the weight
// gradient as ordered per-block partials and a second kernel that adds
// them. conv_implicit_gemm.cu plans a pass here first and launches it here
// when the plan says `direct`.
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/conv_implicit_gemm.hpp"

namespace sg::cuda::conv_direct {

// Fills the direct fields of `plan` (plan.direct = true) when the pass takes
// the direct path on a GPU of `multiprocessors`; false when it does not.
bool plan(ImplicitGemmPlan& plan, int multiprocessors);
// plan()'s weight-gradient part (conv_direct_wgrad.cu).
bool plan_wgrad(ImplicitGemmPlan& plan, int multiprocessors);
// The forward (kFlip false) or, with the transposed flipped filter, the
// backward data pass at stride 1 (kFlip true) of a direct plan.
template <bool kFlip, typename T>
void launch_conv(const ImplicitGemmPlan& plan, const T* in, const T* w, const T* bias, bool relu, T* out,
                 cudaStream_t stream);
// The weight gradient of a direct plan (and the bias gradient when the plan
// has bias_gradient); `workspace` holds its partials.
template <typename T>
void launch_wgrad(const ImplicitGemmPlan& plan, const T* dy, const T* x, T* dw, ConvBiasGradient bias,
                  float* workspace, cudaStream_t stream);
// How many partials of dW the weight gradient's blocks leave (its workspace).
std::int64_t wgrad_parts(const ImplicitGemmPlan& plan);
// The weight gradient's tensor-core kernel (conv_direct_wgrad_mma.cu), for
// f16 / bf16: fills plan.mma when the shape fits it; the partials it leaves
// (0 without plan.mma); its launch, which writes those partials only
// (launch_wgrad adds them).
bool plan_wgrad_mma(ImplicitGemmPlan& plan, int multiprocessors);
std::int64_t mma_wgrad_parts(const ImplicitGemmPlan& plan);
template <typename T>
void launch_wgrad_mma(const ImplicitGemmPlan& plan, const T* dy, const T* x, float* partials, cudaStream_t stream);

}  // namespace sg::cuda::conv_direct
