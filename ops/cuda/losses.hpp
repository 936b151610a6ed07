#pragma once
// Issue 21's losses on the GPU (the CPU references are ref::mse_loss,
// ref::l1_loss and ref::softmax_xent_smoothed). Each loss is one block whose
// per-thread partial sums add in a fixed order (warp butterflies, then warps
// in order): the reported loss has the same bits every run, no atomics.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace sg::cuda {

enum class RegressionLoss : std::uint8_t { mse, l1 };

// loss[0] = mean over n elements of (pred - target)^2 or |pred - target|.
template <typename T>
void launch_regression_loss(RegressionLoss kind, const T* pred, const float* target, std::int64_t n, float* loss,
                            cudaStream_t stream);
// dpred = 2 (pred - target) / n (mse) or sign(pred - target) / n (l1),
// times gradient_scale (the backward's LossGradientAttrs::scale).
template <typename T>
void launch_regression_loss_backward(RegressionLoss kind, const T* pred, const float* target, std::int64_t n,
                                     T* dpred, cudaStream_t stream, float gradient_scale = 1.f);

// Label-smoothed cross-entropy (PyTorch CrossEntropyLoss(label_smoothing=eps)):
// with `loss`, the mean loss (block 0); with `dlogits`,
// (softmax - (1 - eps) onehot - eps / cols) / rows times gradient_scale (a
// warp per row).
template <typename T>
void launch_softmax_xent_smoothed(const T* logits, const std::int32_t* labels, std::int64_t rows, std::int64_t cols,
                                  float eps, float* loss, T* dlogits, cudaStream_t stream, float gradient_scale = 1.f);

}  // namespace sg::cuda
