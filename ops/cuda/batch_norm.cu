// Batch normalisation kernels (see batch_norm.hpp).
#include "ops/cuda/batch_norm.hpp"

#include <cooperative_groups.h>

#include "ops/cuda/block_sum.cuh"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/launch_config.cuh"

namespace sg::cuda {
namespace {

namespace cg = cooperative_groups;

// A cluster of kChannelBlocks blocks per channel: a channel of a small CNN's
// batch holds ~100k values, which one SM alone streams at ~200 GB/s; eight
// share them and add their partial sums through distributed shared memory in
// rank order (the same bits every run, no atomics).
constexpr int kChannelThreads = 512;
constexpr int kChannelBlocks = 8;

// Calls f(k) for the index k of every value of channel c this block (cluster
// rank `rank`) takes, each thread a fixed set. Planes of 32 or more values:
// each warp takes whole examples' planes, its lanes consecutive values
// (coalesced, no division); smaller planes ([N, C], 1x1 to 5x5): a flat loop
// over the channel's n * plane values with 32-bit division.
template <typename F>
__device__ __forceinline__ void for_each_value(const BatchNormShape& s, std::int64_t c, int rank, F&& f) {
  constexpr int warps = kChannelThreads / 32;
  if (s.plane >= 32) {
    const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
    const auto plane = static_cast<unsigned>(s.plane);
    for (std::int64_t e = std::int64_t(rank) * warps + warp; e < s.n; e += warps * kChannelBlocks) {
      const std::int64_t base = (e * s.channels + c) * s.plane;
#pragma unroll 4
      for (unsigned p = lane; p < plane; p += 32) f(base + p);
    }
  } else {
    const auto count = static_cast<unsigned>(s.n * s.plane), plane = static_cast<unsigned>(s.plane);
#pragma unroll 4
    for (unsigned i = unsigned(rank) * kChannelThreads + threadIdx.x; i < count; i += kChannelThreads * kChannelBlocks)
      f((std::int64_t(i / plane) * s.channels + c) * s.plane + i % plane);
  }
}

// Per-block scratch of the cluster sums.
struct ChannelScratch {
  float warps[kChannelThreads / 32];
  float block;  // this block's sum, read by the cluster's other blocks
};

// The sum of v over the cluster's threads, in every thread: block sums, then
// the blocks' in rank order.
__device__ __forceinline__ float cluster_sum(float v, ChannelScratch& scratch) {
  cg::cluster_group cluster = cg::this_cluster();
  const float mine = block_sum<kChannelThreads>(v, scratch.warps);
  if (threadIdx.x == 0) scratch.block = mine;
  cluster.sync();
  float total = 0.f;
  for (unsigned r = 0; r < kChannelBlocks; ++r) total += *cluster.map_shared_rank(&scratch.block, r);
  cluster.sync();  // no block writes its sum again before every block read it
  return total;
}

struct Moments {
  float mean, var, rstd;
};

template <typename T>
__device__ Moments channel_moments(const T* x, const BatchNormShape& s, std::int64_t c, int rank,
                                   ChannelScratch& scratch) {
  const float count = float(s.n * s.plane);
  float sum = 0.f;
  for_each_value(s, c, rank, [&](std::int64_t k) { sum += to_float(x[k]); });
  const float mean = cluster_sum(sum, scratch) / count;
  float squares = 0.f;
  for_each_value(s, c, rank, [&](std::int64_t k) {
    const float d = to_float(x[k]) - mean;
    squares += d * d;
  });
  const float var = cluster_sum(squares, scratch) / count;
  return {mean, var, 1.f / sqrtf(var + s.eps)};
}

// Block b of the grid: channel b / kChannelBlocks, cluster rank b % kChannelBlocks.
__device__ __forceinline__ std::int64_t channel_of_block() { return blockIdx.x / kChannelBlocks; }
__device__ __forceinline__ int rank_in_channel() { return int(cg::this_cluster().block_rank()); }

// running = (1 - momentum) running + momentum * the batch's, the variance unbiased (PyTorch's).
__device__ __forceinline__ void update_running(const Moments& m, const BatchNormShape& s, std::int64_t c,
                                               float* running_mean, float* running_var) {
  const float count = float(s.n * s.plane);
  running_mean[c] = (1.f - s.momentum) * running_mean[c] + s.momentum * m.mean;
  running_var[c] = (1.f - s.momentum) * running_var[c] + s.momentum * m.var * count / (count - 1.f);
}

template <typename T>
__global__ void __cluster_dims__(kChannelBlocks, 1, 1) __launch_bounds__(kChannelThreads)
    batch_norm_forward_kernel(const T* x, const T* gamma, const T* beta, BatchNormShape s, T* y, float* running_mean,
                              float* running_var) {
  __shared__ ChannelScratch scratch;
  const std::int64_t c = channel_of_block();
  const int rank = rank_in_channel();
  const Moments m = channel_moments(x, s, c, rank, scratch);
  if (running_mean && rank == 0 && threadIdx.x == 0) update_running(m, s, c, running_mean, running_var);
  const float g = to_float(gamma[c]), b = to_float(beta[c]);
  for_each_value(s, c, rank, [&](std::int64_t k) { y[k] = from_float<T>((to_float(x[k]) - m.mean) * m.rstd * g + b); });
}

template <typename T>
__global__ void __cluster_dims__(kChannelBlocks, 1, 1) __launch_bounds__(kChannelThreads)
    batch_norm_backward_kernel(const T* dy, const T* x, const T* gamma, BatchNormShape s, T* dx, T* dgamma, T* dbeta) {
  __shared__ ChannelScratch scratch;
  const std::int64_t c = channel_of_block();
  const int rank = rank_in_channel();
  const float count = float(s.n * s.plane);
  const Moments m = channel_moments(x, s, c, rank, scratch);
  float dy_sum = 0.f, dyx_sum = 0.f;
  for_each_value(s, c, rank, [&](std::int64_t k) {
    const float grad = to_float(dy[k]);
    dy_sum += grad;
    dyx_sum += grad * ((to_float(x[k]) - m.mean) * m.rstd);
  });
  dy_sum = cluster_sum(dy_sum, scratch);
  dyx_sum = cluster_sum(dyx_sum, scratch);
  if (rank == 0 && threadIdx.x == 0) {
    if (dgamma) dgamma[c] = from_float<T>(dyx_sum);
    if (dbeta) dbeta[c] = from_float<T>(dy_sum);
  }
  if (!dx) return;
  const float g = to_float(gamma[c]);
  const float g_mean = g * dy_sum / count, gx_mean = g * dyx_sum / count;
  for_each_value(s, c, rank, [&](std::int64_t k) {
    const float xhat = (to_float(x[k]) - m.mean) * m.rstd;
    dx[k] = from_float<T>(m.rstd * (to_float(dy[k]) * g - g_mean - xhat * gx_mean));
  });
}

template <typename T>
__global__ void __cluster_dims__(kChannelBlocks, 1, 1) __launch_bounds__(kChannelThreads)
    batch_norm_stats_kernel(const T* x, BatchNormShape s, float* running_mean, float* running_var) {
  __shared__ ChannelScratch scratch;
  const std::int64_t c = channel_of_block();
  const int rank = rank_in_channel();
  const Moments m = channel_moments(x, s, c, rank, scratch);
  if (rank == 0 && threadIdx.x == 0) update_running(m, s, c, running_mean, running_var);
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

// A cluster per channel (the grid's x limit, 2^31 - 1 blocks, is far off).
unsigned channel_blocks(std::int64_t channels) { return static_cast<unsigned>(channels * kChannelBlocks); }

}  // namespace

template <typename T>
void launch_batch_norm_forward(const T* x, const T* gamma, const T* beta, const BatchNormShape& s, T* y,
                               cudaStream_t stream, float* running_mean, float* running_var) {
  batch_norm_forward_kernel<<<channel_blocks(s.channels), kChannelThreads, 0, stream>>>(x, gamma, beta, s, y,
                                                                                        running_mean, running_var);
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
  template void launch_batch_norm_forward<T>(const T*, const T*, const T*, const BatchNormShape&, T*, cudaStream_t,  \
                                             float*, float*);                                                     \
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
