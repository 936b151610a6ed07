// Batch normalisation kernels (see batch_norm.hpp).
#include "ops/cuda/batch_norm.hpp"
#include "ops/cuda/block_sum.cuh"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/launch_config.cuh"

namespace sg::cuda {
namespace {

constexpr int kChannelThreads = 256;

// Index of value i (of n * plane) of channel c.
__device__ __forceinline__ std::int64_t at(const BatchNormShape& s, std::int64_t c, std::int64_t i) {
  return (i / s.plane * s.channels + c) * s.plane + i % s.plane;
}

struct Moments {
  float mean, var, rstd;
};

template <typename T>
__device__ Moments channel_moments(const T* x, const BatchNormShape& s, std::int64_t c, float* shared) {
  const std::int64_t count = s.n * s.plane;
  float sum = 0.f;
  for (std::int64_t i = threadIdx.x; i < count; i += kChannelThreads) sum += to_float(x[at(s, c, i)]);
  const float mean = block_sum<kChannelThreads>(sum, shared) / float(count);
  float squares = 0.f;
  for (std::int64_t i = threadIdx.x; i < count; i += kChannelThreads) {
    const float d = to_float(x[at(s, c, i)]) - mean;
    squares += d * d;
  }
  const float var = block_sum<kChannelThreads>(squares, shared) / float(count);
  return {mean, var, 1.f / sqrtf(var + s.eps)};
}

template <typename T>
__global__ void __launch_bounds__(kChannelThreads)
    batch_norm_forward_kernel(const T* x, const T* gamma, const T* beta, BatchNormShape s, T* y) {
  __shared__ float shared[kChannelThreads / 32];
  for (std::int64_t c = blockIdx.x; c < s.channels; c += gridDim.x) {
    const Moments m = channel_moments(x, s, c, shared);
    const float g = to_float(gamma[c]), b = to_float(beta[c]);
    for (std::int64_t i = threadIdx.x; i < s.n * s.plane; i += kChannelThreads) {
      const std::int64_t k = at(s, c, i);
      y[k] = from_float<T>((to_float(x[k]) - m.mean) * m.rstd * g + b);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kChannelThreads)
    batch_norm_backward_kernel(const T* dy, const T* x, const T* gamma, BatchNormShape s, T* dx, T* dgamma, T* dbeta) {
  __shared__ float shared[kChannelThreads / 32];
  const std::int64_t count = s.n * s.plane;
  for (std::int64_t c = blockIdx.x; c < s.channels; c += gridDim.x) {
    const Moments m = channel_moments(x, s, c, shared);
    float dy_sum = 0.f, dyx_sum = 0.f;
    for (std::int64_t i = threadIdx.x; i < count; i += kChannelThreads) {
      const std::int64_t k = at(s, c, i);
      const float grad = to_float(dy[k]);
      dy_sum += grad;
      dyx_sum += grad * ((to_float(x[k]) - m.mean) * m.rstd);
    }
    dy_sum = block_sum<kChannelThreads>(dy_sum, shared);
    dyx_sum = block_sum<kChannelThreads>(dyx_sum, shared);
    if (threadIdx.x == 0) {
      if (dgamma) dgamma[c] = from_float<T>(dyx_sum);
      if (dbeta) dbeta[c] = from_float<T>(dy_sum);
    }
    if (!dx) continue;
    const float g = to_float(gamma[c]);
    const float g_mean = g * dy_sum / float(count), gx_mean = g * dyx_sum / float(count);
    for (std::int64_t i = threadIdx.x; i < count; i += kChannelThreads) {
      const std::int64_t k = at(s, c, i);
      const float xhat = (to_float(x[k]) - m.mean) * m.rstd;
      dx[k] = from_float<T>(m.rstd * (to_float(dy[k]) * g - g_mean - xhat * gx_mean));
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kChannelThreads)
    batch_norm_stats_kernel(const T* x, BatchNormShape s, float* running_mean, float* running_var) {
  __shared__ float shared[kChannelThreads / 32];
  const float count = float(s.n * s.plane);
  for (std::int64_t c = blockIdx.x; c < s.channels; c += gridDim.x) {
    const Moments m = channel_moments(x, s, c, shared);
    if (threadIdx.x == 0) {
      running_mean[c] = (1.f - s.momentum) * running_mean[c] + s.momentum * m.mean;
      running_var[c] = (1.f - s.momentum) * running_var[c] + s.momentum * m.var * count / (count - 1.f);
    }
  }
}

template <typename T>
__global__ void batch_norm_inference_kernel(const T* x, const T* gamma, const T* beta, const float* running_mean,
                                            const float* running_var, BatchNormShape s, T* y) {
  const std::int64_t total = s.n * s.channels * s.plane;
  for (std::int64_t k = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < total;
       k += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t c = k / s.plane % s.channels;
    const float rstd = 1.f / sqrtf(running_var[c] + s.eps);
    y[k] = from_float<T>((to_float(x[k]) - running_mean[c]) * rstd * to_float(gamma[c]) + to_float(beta[c]));
  }
}

unsigned channel_blocks(std::int64_t channels) {
  return static_cast<unsigned>(channels < 1 ? 1 : (channels > 65535 * 8 ? 65535 * 8 : channels));
}

}  // namespace

template <typename T>
void launch_batch_norm_forward(const T* x, const T* gamma, const T* beta, const BatchNormShape& s, T* y,
                               cudaStream_t stream) {
  batch_norm_forward_kernel<<<channel_blocks(s.channels), kChannelThreads, 0, stream>>>(x, gamma, beta, s, y);
  SG_LAUNCH_CHECK("batch_norm_forward_kernel");
}

template <typename T>
void launch_batch_norm_backward(const T* dy, const T* x, const T* gamma, const BatchNormShape& s, T* dx, T* dgamma,
                                T* dbeta, cudaStream_t stream) {
  batch_norm_backward_kernel<<<channel_blocks(s.channels), kChannelThreads, 0, stream>>>(dy, x, gamma, s, dx, dgamma,
                                                                                         dbeta);
  SG_LAUNCH_CHECK("batch_norm_backward_kernel");
}

template <typename T>
void launch_batch_norm_stats_update(const T* x, const BatchNormShape& s, float* running_mean, float* running_var,
                                    cudaStream_t stream) {
  batch_norm_stats_kernel<<<channel_blocks(s.channels), kChannelThreads, 0, stream>>>(x, s, running_mean, running_var);
  SG_LAUNCH_CHECK("batch_norm_stats_kernel");
}

template <typename T>
void launch_batch_norm_inference(const T* x, const T* gamma, const T* beta, const float* running_mean,
                                 const float* running_var, const BatchNormShape& s, T* y, cudaStream_t stream) {
  batch_norm_inference_kernel<<<blocks_for(s.n * s.channels * s.plane), kThreads, 0, stream>>>(
      x, gamma, beta, running_mean, running_var, s, y);
  SG_LAUNCH_CHECK("batch_norm_inference_kernel");
}

#define SG_INSTANTIATE_BATCH_NORM(T)                                                                               \
  template void launch_batch_norm_forward<T>(const T*, const T*, const T*, const BatchNormShape&, T*, cudaStream_t); \
  template void launch_batch_norm_backward<T>(const T*, const T*, const T*, const BatchNormShape&, T*, T*, T*,     \
                                              cudaStream_t);                                                       \
  template void launch_batch_norm_stats_update<T>(const T*, const BatchNormShape&, float*, float*, cudaStream_t);  \
  template void launch_batch_norm_inference<T>(const T*, const T*, const T*, const float*, const float*,           \
                                               const BatchNormShape&, T*, cudaStream_t);
SG_INSTANTIATE_BATCH_NORM(float)
SG_INSTANTIATE_BATCH_NORM(__half)
SG_INSTANTIATE_BATCH_NORM(__nv_bfloat16)
#undef SG_INSTANTIATE_BATCH_NORM

}  // namespace sg::cuda
