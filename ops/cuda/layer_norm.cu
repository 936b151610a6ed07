// Layer normalisation kernels (see layer_norm.hpp).
#include "ops/cuda/block_sum.cuh"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/launch_config.cuh"
#include "ops/cuda/layer_norm.hpp"

namespace sg::cuda {
namespace {

constexpr int kRowThreads = 256;

// Mean and 1/std of row r of x [rows, d]: two passes, as the reference.
template <typename T>
__device__ float2 row_moments(const T* row, std::int64_t d, float eps, float* shared) {
  float sum = 0.f;
  for (std::int64_t j = threadIdx.x; j < d; j += kRowThreads) sum += to_float(row[j]);
  const float mean = block_sum<kRowThreads>(sum, shared) / float(d);
  float squares = 0.f;
  for (std::int64_t j = threadIdx.x; j < d; j += kRowThreads) {
    const float dev = to_float(row[j]) - mean;
    squares += dev * dev;
  }
  const float var = block_sum<kRowThreads>(squares, shared) / float(d);
  return {mean, 1.f / sqrtf(var + eps)};
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    layer_norm_forward_kernel(const T* x, const T* gamma, const T* beta, std::int64_t rows, std::int64_t d, float eps,
                              T* y) {
  __shared__ float shared[kRowThreads / 32];
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = x + r * d;
    const float2 m = row_moments(row, d, eps, shared);
    for (std::int64_t j = threadIdx.x; j < d; j += kRowThreads)
      y[r * d + j] = from_float<T>((to_float(row[j]) - m.x) * m.y * to_float(gamma[j]) + to_float(beta[j]));
  }
}

template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    layer_norm_dx_kernel(const T* dy, const T* x, const T* gamma, std::int64_t rows, std::int64_t d, float eps, T* dx,
                         float* means, float* rstds) {
  __shared__ float shared[kRowThreads / 32];
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = x + r * d;
    const T* grad = dy + r * d;
    const float2 m = row_moments(row, d, eps, shared);
    float g_sum = 0.f, gx_sum = 0.f;
    for (std::int64_t j = threadIdx.x; j < d; j += kRowThreads) {
      const float g = to_float(grad[j]) * to_float(gamma[j]);
      g_sum += g;
      gx_sum += g * (to_float(row[j]) - m.x) * m.y;
    }
    const float g_mean = block_sum<kRowThreads>(g_sum, shared) / float(d);
    const float gx_mean = block_sum<kRowThreads>(gx_sum, shared) / float(d);
    if (dx)
      for (std::int64_t j = threadIdx.x; j < d; j += kRowThreads) {
        const float xhat = (to_float(row[j]) - m.x) * m.y;
        dx[r * d + j] = from_float<T>(m.y * (to_float(grad[j]) * to_float(gamma[j]) - g_mean - xhat * gx_mean));
      }
    if (threadIdx.x == 0) {
      means[r] = m.x;
      rstds[r] = m.y;
    }
  }
}

template <typename T>
__global__ void layer_norm_affine_grad_kernel(const T* dy, const T* x, const float* means, const float* rstds,
                                              std::int64_t rows, std::int64_t d, T* dgamma, T* dbeta) {
  for (std::int64_t j = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < d;
       j += std::int64_t(gridDim.x) * blockDim.x) {
    float g = 0.f, b = 0.f;
    for (std::int64_t r = 0; r < rows; ++r) {
      const float grad = to_float(dy[r * d + j]);
      g += grad * ((to_float(x[r * d + j]) - means[r]) * rstds[r]);
      b += grad;
    }
    if (dgamma) dgamma[j] = from_float<T>(g);
    if (dbeta) dbeta[j] = from_float<T>(b);
  }
}

unsigned row_blocks(std::int64_t rows) { return static_cast<unsigned>(rows < 65535 * 8 ? (rows < 1 ? 1 : rows) : 65535 * 8); }

}  // namespace

template <typename T>
void launch_layer_norm_forward(const T* x, const T* gamma, const T* beta, std::int64_t rows, std::int64_t d, float eps,
                               T* y, cudaStream_t stream) {
  layer_norm_forward_kernel<<<row_blocks(rows), kRowThreads, 0, stream>>>(x, gamma, beta, rows, d, eps, y);
  SG_LAUNCH_CHECK("layer_norm_forward_kernel");
}

LayerNormBackward::LayerNormBackward(std::int64_t rows, std::int64_t d, float eps)
    : rows_(rows), d_(d), eps_(eps), moments_(static_cast<std::size_t>(2 * rows) * sizeof(float)) {}

template <typename T>
void LayerNormBackward::run(const T* dy, const T* x, const T* gamma, T* dx, T* dgamma, T* dbeta,
                            cudaStream_t stream) const {
  float* means = moments_.as<float>();
  float* rstds = means + rows_;
  layer_norm_dx_kernel<<<row_blocks(rows_), kRowThreads, 0, stream>>>(dy, x, gamma, rows_, d_, eps_, dx, means, rstds);
  SG_LAUNCH_CHECK("layer_norm_dx_kernel");
  if (!dgamma && !dbeta) return;
  layer_norm_affine_grad_kernel<<<blocks_for(d_), kThreads, 0, stream>>>(dy, x, means, rstds, rows_, d_, dgamma,
                                                                         dbeta);
  SG_LAUNCH_CHECK("layer_norm_affine_grad_kernel");
}

#define SG_INSTANTIATE_LAYER_NORM(T)                                                                             \
  template void launch_layer_norm_forward<T>(const T*, const T*, const T*, std::int64_t, std::int64_t, float, T*, \
                                             cudaStream_t);                                                      \
  template void LayerNormBackward::run<T>(const T*, const T*, const T*, T*, T*, T*, cudaStream_t) const;
SG_INSTANTIATE_LAYER_NORM(float)
SG_INSTANTIATE_LAYER_NORM(__half)
SG_INSTANTIATE_LAYER_NORM(__nv_bfloat16)
#undef SG_INSTANTIATE_LAYER_NORM

}  // namespace sg::cuda
