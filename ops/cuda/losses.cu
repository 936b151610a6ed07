// Regression losses (mse, l1) and label-smoothed cross-entropy: see losses.hpp.
#include <algorithm>
#include <cfloat>

#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/launch_config.cuh"
#include "ops/cuda/losses.hpp"
#include "ops/cuda/warp_reduce.cuh"

namespace sg::cuda {
namespace {

constexpr int kLossThreads = 1024;
constexpr int kLossWarps = kLossThreads / 32;
constexpr unsigned kMaxGradientBlocks = 4096;

// Block-wide sum in a fixed order; thread 0 stores total * scale.
template <int Warps>
__device__ void store_block_total(float partial, float* out, float scale) {
  __shared__ float partials[Warps];
  const float w = warp_sum(partial);
  if (threadIdx.x % 32 == 0) partials[threadIdx.x / 32] = w;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.f;
    for (int i = 0; i < Warps; ++i) total += partials[i];
    *out = total * scale;
  }
}

template <typename T>
__global__ void __launch_bounds__(kLossThreads)
    regression_loss_kernel(RegressionLoss kind, const T* pred, const float* target, std::int64_t n, float* loss) {
  float partial = 0.f;
  for (std::int64_t i = threadIdx.x; i < n; i += kLossThreads) {
    const float d = to_float(pred[i]) - target[i];
    partial += kind == RegressionLoss::mse ? d * d : fabsf(d);
  }
  store_block_total<kLossWarps>(partial, loss, 1.f / static_cast<float>(n));
}

template <typename T>
__global__ void regression_loss_backward_kernel(RegressionLoss kind, const T* pred, const float* target,
                                                std::int64_t n, T* dpred, float gradient_scale) {
  const float inv_n = gradient_scale / static_cast<float>(n);
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const float d = to_float(pred[i]) - target[i];
    const float g = kind == RegressionLoss::mse ? 2.f * d : (d > 0.f ? 1.f : d < 0.f ? -1.f : 0.f);
    dpred[i] = from_float<T>(g * inv_n);
  }
}

// Block 0: the loss, a thread per row. Blocks 1..: dlogits, a warp per row.
template <typename T>
__global__ void __launch_bounds__(kLossThreads)
    softmax_xent_smoothed_kernel(const T* logits, const std::int32_t* labels, std::int64_t rows, std::int64_t cols,
                                 float eps, float* loss, T* dlogits, float gradient_scale) {
  if (blockIdx.x == 0) {
    if (!loss) return;
    float partial = 0.f;
    for (std::int64_t r = threadIdx.x; r < rows; r += kLossThreads) {
      const T* row = logits + r * cols;
      float mx = -FLT_MAX, row_sum = 0.f;
      for (std::int64_t c = 0; c < cols; ++c) {
        mx = fmaxf(mx, to_float(row[c]));
        row_sum += to_float(row[c]);
      }
      float sum = 0.f;
      for (std::int64_t c = 0; c < cols; ++c) sum += expf(to_float(row[c]) - mx);
      const float lse = logf(sum) + mx;
      partial += (1.f - eps) * (lse - to_float(row[labels[r]])) + eps * (lse - row_sum / static_cast<float>(cols));
    }
    store_block_total<kLossWarps>(partial, loss, 1.f / static_cast<float>(rows));
    return;
  }
  const int lane = threadIdx.x % 32;
  const std::int64_t warps = std::int64_t(gridDim.x - 1) * (blockDim.x / 32);
  const float inv_rows = gradient_scale / static_cast<float>(rows), uniform = eps / static_cast<float>(cols);
  for (std::int64_t r = std::int64_t(blockIdx.x - 1) * (blockDim.x / 32) + threadIdx.x / 32; r < rows; r += warps) {
    const T* row = logits + r * cols;
    float mx = -FLT_MAX;
    for (std::int64_t c = lane; c < cols; c += 32) mx = fmaxf(mx, to_float(row[c]));
    mx = warp_max(mx);
    float sum = 0.f;
    for (std::int64_t c = lane; c < cols; c += 32) sum += expf(to_float(row[c]) - mx);
    sum = warp_sum(sum);
    const std::int32_t label = labels[r];
    for (std::int64_t c = lane; c < cols; c += 32) {
      const float target = (c == label ? 1.f - eps : 0.f) + uniform;
      dlogits[r * cols + c] = from_float<T>((expf(to_float(row[c]) - mx) / sum - target) * inv_rows);
    }
  }
}

}  // namespace

template <typename T>
void launch_regression_loss(RegressionLoss kind, const T* pred, const float* target, std::int64_t n, float* loss,
                            cudaStream_t stream) {
  regression_loss_kernel<<<1, kLossThreads, 0, stream>>>(kind, pred, target, n, loss);
  SG_LAUNCH_CHECK("regression_loss_kernel");
}

template <typename T>
void launch_regression_loss_backward(RegressionLoss kind, const T* pred, const float* target, std::int64_t n,
                                     T* dpred, cudaStream_t stream, float gradient_scale) {
  regression_loss_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(kind, pred, target, n, dpred, gradient_scale);
  SG_LAUNCH_CHECK("regression_loss_backward_kernel");
}

template <typename T>
void launch_softmax_xent_smoothed(const T* logits, const std::int32_t* labels, std::int64_t rows, std::int64_t cols,
                                  float eps, float* loss, T* dlogits, cudaStream_t stream, float gradient_scale) {
  // Block 0 (the loss) and the gradient blocks share one block size: 32
  // warps, a row each.
  const int threads = kLossThreads;
  const unsigned warps_per_block = threads / 32;
  const unsigned gradient_blocks =
      dlogits ? static_cast<unsigned>(std::min<std::int64_t>((rows + warps_per_block - 1) / warps_per_block,
                                                             kMaxGradientBlocks))
              : 0;
  softmax_xent_smoothed_kernel<<<1 + gradient_blocks, threads, 0, stream>>>(logits, labels, rows, cols, eps, loss,
                                                                            dlogits, gradient_scale);
  SG_LAUNCH_CHECK("softmax_xent_smoothed_kernel");
}

#define SG_INSTANTIATE(T)                                                                                       \
  template void launch_regression_loss<T>(RegressionLoss, const T*, const float*, std::int64_t, float*,         \
                                          cudaStream_t);                                                        \
  template void launch_regression_loss_backward<T>(RegressionLoss, const T*, const float*, std::int64_t, T*,    \
                                                   cudaStream_t, float);                                        \
  template void launch_softmax_xent_smoothed<T>(const T*, const std::int32_t*, std::int64_t, std::int64_t, float, \
                                                float*, T*, cudaStream_t, float);
SG_INSTANTIATE(float)
SG_INSTANTIATE(__half)
SG_INSTANTIATE(__nv_bfloat16)
#undef SG_INSTANTIATE

}  // namespace sg::cuda
