// Batch normalisation kernels (see batch_norm.hpp).
#include "ops/cuda/batch_norm.hpp"

#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "ops/cuda/batch_norm_moments.cuh"
#include "ops/cuda/batch_norm_rows.hpp"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/launch_config.cuh"
#include "ops/cuda/warp_reduce.cuh"

namespace sg::cuda {
namespace {

namespace cg = cooperative_groups;

// A cluster of up to kMaxChannelBlocks blocks per channel, one per ~12k of
// its values: a channel of a small CNN's batch holds ~100k values, which one
// SM alone streams at ~200 GB/s, so eight share them and add their partial
// sums through distributed shared memory in rank order (the same bits every
// run, no atomics); a 7x7 plane's channel (~6k values) takes one block, where
// eight spent their time in cluster barriers.
constexpr int kChannelThreads = 512;
constexpr int kMaxChannelBlocks = 8;  // the portable cluster size
constexpr std::int64_t kValuesPerBlock = 12 * 1024;
constexpr int kMaxSums = 4;

// N consecutive values of one plane, loaded and stored as one access (up to
// 16 bytes): one thread keeps 4 x 16 bytes in flight where scalar loads of
// 2 bytes left a small CNN's channels latency-bound.
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// Calls f(k) for the first index k of every pack of channel c this block
// (cluster rank `rank`) takes, each thread a fixed set: pack j of the channel
// is example j / P's values (j % P) * N.. of its plane (P = plane / N packs
// per plane). The host checks that n * P fits 32 bits.
template <int N, typename F>
__device__ __forceinline__ void for_each_pack(const BatchNormShape& s, std::int64_t c, int rank, F&& f) {
  const auto per_plane = static_cast<unsigned>(s.plane / N);
  const auto count = static_cast<unsigned>(s.n) * per_plane;
  const unsigned step = kChannelThreads * cg::this_cluster().num_blocks();
#pragma unroll 4
  for (unsigned j = unsigned(rank) * kChannelThreads + threadIdx.x; j < count; j += step)
    f((std::int64_t(j / per_plane) * s.channels + c) * s.plane + std::int64_t(j % per_plane) * N);
}

template <typename T, int N>
__device__ __forceinline__ Pack<T, N> load(const T* p, std::int64_t k) {
  return *reinterpret_cast<const Pack<T, N>*>(p + k);
}

// Packs a thread keeps in registers from the sums to the output pass when a
// channel's values fit the cluster's threads so (64 bytes per tensor, 16
// packs at most): then x (and dy) are read once, all of a thread's loads in
// flight together, where the streaming kernels read them twice, each pass
// waiting out the loads' latency again (a 7x7 plane's channel: ~12 us for ~6k values).
template <typename T, int N>
__host__ __device__ constexpr int resident_packs() {
  return 64 / (N * int(sizeof(T))) < 16 ? 64 / (N * int(sizeof(T))) : 16;
}

// for_each_pack's packs with their slot r < R in the thread's registers (the
// same packs in the same order, so the sums keep their bits).
template <int N, int R, typename F>
__device__ __forceinline__ void for_each_resident(const BatchNormShape& s, std::int64_t c, int rank, F&& f) {
  const auto per_plane = static_cast<unsigned>(s.plane / N);
  const auto count = static_cast<unsigned>(s.n) * per_plane;
  const unsigned step = kChannelThreads * cg::this_cluster().num_blocks();
  const unsigned first = unsigned(rank) * kChannelThreads + threadIdx.x;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const unsigned j = first + unsigned(r) * step;
    if (j < count) f(r, (std::int64_t(j / per_plane) * s.channels + c) * s.plane + std::int64_t(j % per_plane) * N);
  }
}

// Per-block scratch of the cluster sums.
struct ChannelScratch {
  float warps[kMaxSums][kChannelThreads / 32];
  float block[kMaxSums];  // this block's sums, read by the cluster's other blocks
};

// The sums of v[0..M) over the cluster's threads, in every thread: warp
// butterflies, the warps' sums in warp order, then the blocks' in rank order.
template <int M>
__device__ __forceinline__ void cluster_sums(float (&v)[M], ChannelScratch& scratch) {
  cg::cluster_group cluster = cg::this_cluster();
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const float w = warp_sum(v[m]);
    if (lane == 0) scratch.warps[m][warp] = w;
  }
  __syncthreads();
  if (threadIdx.x < M) {
    float total = 0.f;
    for (int w = 0; w < kChannelThreads / 32; ++w) total += scratch.warps[threadIdx.x][w];
    scratch.block[threadIdx.x] = total;
  }
  cluster.sync();
#pragma unroll
  for (int m = 0; m < M; ++m) {
    float total = 0.f;
    for (unsigned r = 0; r < cluster.num_blocks(); ++r) total += cluster.map_shared_rank(scratch.block, r)[m];
    v[m] = total;
  }
  cluster.sync();  // no block writes its sums again before every block read them
}

// Block b of the grid: channel b / (cluster size), its rank in the cluster b % (cluster size).
__device__ __forceinline__ std::int64_t channel_of_block() { return blockIdx.x / cg::this_cluster().num_blocks(); }
__device__ __forceinline__ int rank_in_channel() { return int(cg::this_cluster().block_rank()); }

// The channel's first value: the shift of its sums.
template <typename T>
__device__ __forceinline__ float channel_shift(const T* x, const BatchNormShape& s, std::int64_t c) {
  return to_float(x[c * s.plane]);
}

// Adds a pack's deviations from `shift` into sums[0] and their squares into sums[1].
template <typename T, int N>
__device__ __forceinline__ void add_deviations(const Pack<T, N>& p, float shift, float (&sums)[2]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const float d = to_float(p.v[i]) - shift;
    sums[0] += d;
    sums[1] += d * d;
  }
}

template <typename T, int N>
__device__ Moments channel_moments(const T* x, const BatchNormShape& s, std::int64_t c, int rank,
                                   ChannelScratch& scratch) {
  const float shift = channel_shift(x, s, c);
  float sums[2] = {0.f, 0.f};
  for_each_pack<N>(s, c, rank, [&](std::int64_t k) { add_deviations(load<T, N>(x, k), shift, sums); });
  cluster_sums(sums, scratch);
  return moments_from(shift, sums[0], sums[1], float(s.n * s.plane), s.eps);
}

// running = (1 - momentum) running + momentum * the batch's (batch_norm_moments.cuh).
__device__ __forceinline__ void update_running(const Moments& m, const BatchNormShape& s, std::int64_t c,
                                               float* running_mean, float* running_var) {
  update_running(m, float(s.n * s.plane), s.momentum, c, running_mean, running_var);
}

// One packed output of the forward: the normalised value [+ the residual,
// rounded as the graph stores the add] [then ReLU].
template <typename T, int N>
__device__ __forceinline__ Pack<T, N> normalised(const Pack<T, N>& in, const Pack<T, N>& skip, bool residual,
                                                 float mean, float scale, float b, float floor) {
  Pack<T, N> out;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    float v = (to_float(in.v[i]) - mean) * scale + b;
    // The add rounds as the graph stores it: the normalised value to T, then the sum.
    if (residual) v = to_float(from_float<T>(v)) + to_float(skip.v[i]);
    out.v[i] = from_float<T>(fmaxf(v, floor));
  }
  return out;
}

// kResident: the channel's values stay in registers (resident_packs) from
// the sums to the output; else two passes over x.
template <typename T, int N, bool kResident>
__global__ void __launch_bounds__(kChannelThreads)
    batch_norm_forward_kernel(const T* x, const T* gamma, const T* beta, BatchNormShape s, T* y, float* running_mean,
                              float* running_var, const T* residual, bool relu) {
  __shared__ ChannelScratch scratch;
  constexpr int R = resident_packs<T, N>();
  const std::int64_t c = channel_of_block();
  const int rank = rank_in_channel();
  Pack<T, N> held[kResident ? R : 1];
  Moments m;
  if constexpr (kResident) {
    const float shift = channel_shift(x, s, c);
    for_each_resident<N, R>(s, c, rank, [&](int r, std::int64_t k) { held[r] = load<T, N>(x, k); });
    float sums[2] = {0.f, 0.f};
    for_each_resident<N, R>(s, c, rank, [&](int r, std::int64_t) { add_deviations(held[r], shift, sums); });
    cluster_sums(sums, scratch);
    m = moments_from(shift, sums[0], sums[1], float(s.n * s.plane), s.eps);
  } else {
    m = channel_moments<T, N>(x, s, c, rank, scratch);
  }
  if (running_mean && rank == 0 && threadIdx.x == 0) update_running(m, s, c, running_mean, running_var);
  const float scale = m.rstd * to_float(gamma[c]), b = to_float(beta[c]);
  const float floor = relu ? 0.f : -INFINITY;
  auto output = [&](const Pack<T, N>& in, std::int64_t k) {
    Pack<T, N> skip{};
    if (residual) skip = load<T, N>(residual, k);
    *reinterpret_cast<Pack<T, N>*>(y + k) = normalised(in, skip, residual != nullptr, m.mean, scale, b, floor);
  };
  if constexpr (kResident)
    for_each_resident<N, R>(s, c, rank, [&](int r, std::int64_t k) { output(held[r], k); });
  else
    for_each_pack<N>(s, c, rank, [&](std::int64_t k) { output(load<T, N>(x, k), k); });
}

// The gradient of batch_norm's output from the launch's gradient inputs:
// with dy_other, dy + dy_other rounded to T (an add of two branches'
// gradients, as the graph stores it); with relu_out, that is the gradient of
// a ReLU after the batch_norm whose output relu_out is: it passes where
// relu_out > 0 (relu_backward's rule).
template <typename T, int N>
struct GradientIn {
  const T *dy, *dy_other, *relu_out;

  __device__ __forceinline__ Pack<T, N> operator()(std::int64_t k) const {
    Pack<T, N> g = load<T, N>(dy, k), other{}, r{};
    if (dy_other) other = load<T, N>(dy_other, k);
    if (relu_out) r = load<T, N>(relu_out, k);
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if (dy_other) g.v[i] = from_float<T>(to_float(g.v[i]) + to_float(other.v[i]));
      if (relu_out && !(to_float(r.v[i]) > 0.f)) g.v[i] = from_float<T>(0.f);
    }
    return g;
  }
};

template <typename T, int N, bool kResident>
__global__ void __launch_bounds__(kChannelThreads)
    batch_norm_backward_kernel(GradientIn<T, N> gradient, const T* x, const T* gamma, BatchNormShape s, T* dx,
                               T* dgamma, T* dbeta) {
  __shared__ ChannelScratch scratch;
  constexpr int R = resident_packs<T, N>();
  const std::int64_t c = channel_of_block();
  const int rank = rank_in_channel();
  const float count = float(s.n * s.plane);
  const float shift = channel_shift(x, s, c);
  // One pass: the moments' shifted sums with sum(dy) and sum(dy * (x - shift)).
  float sums[4] = {0.f, 0.f, 0.f, 0.f};
  auto add = [&](const Pack<T, N>& xp, const Pack<T, N>& gp) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const float d = to_float(xp.v[i]) - shift, grad = to_float(gp.v[i]);
      sums[0] += d;
      sums[1] += d * d;
      sums[2] += grad;
      sums[3] += grad * d;
    }
  };
  Pack<T, N> held_x[kResident ? R : 1], held_g[kResident ? R : 1];
  if constexpr (kResident) {
    for_each_resident<N, R>(s, c, rank, [&](int r, std::int64_t k) {
      held_x[r] = load<T, N>(x, k);
      held_g[r] = gradient(k);
    });
    for_each_resident<N, R>(s, c, rank, [&](int r, std::int64_t) { add(held_x[r], held_g[r]); });
  } else {
    for_each_pack<N>(s, c, rank, [&](std::int64_t k) { add(load<T, N>(x, k), gradient(k)); });
  }
  cluster_sums(sums, scratch);
  const Moments m = moments_from(shift, sums[0], sums[1], count, s.eps);
  const float dy_sum = sums[2];
  // sum(dy * xhat) = rstd * (sum(dy * (x - shift)) - (mean - shift) * sum(dy)).
  const float dyx_sum = m.rstd * (sums[3] - (sums[0] / count) * dy_sum);
  if (rank == 0 && threadIdx.x == 0) {
    if (dgamma) dgamma[c] = from_float<T>(dyx_sum);
    if (dbeta) dbeta[c] = from_float<T>(dy_sum);
  }
  if (!dx) return;
  const float g = to_float(gamma[c]);
  const float g_mean = g * dy_sum / count, gx_mean = g * dyx_sum / count;
  auto output = [&](const Pack<T, N>& xp, const Pack<T, N>& gp, std::int64_t k) {
    Pack<T, N> out;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const float xhat = (to_float(xp.v[i]) - m.mean) * m.rstd;
      out.v[i] = from_float<T>(m.rstd * (to_float(gp.v[i]) * g - g_mean - xhat * gx_mean));
    }
    *reinterpret_cast<Pack<T, N>*>(dx + k) = out;
  };
  if constexpr (kResident)
    for_each_resident<N, R>(s, c, rank, [&](int r, std::int64_t k) { output(held_x[r], held_g[r], k); });
  else
    for_each_pack<N>(s, c, rank, [&](std::int64_t k) { output(load<T, N>(x, k), gradient(k), k); });
}

template <typename T, int N>
__global__ void __launch_bounds__(kChannelThreads)
    batch_norm_stats_kernel(const T* x, BatchNormShape s, float* running_mean, float* running_var) {
  __shared__ ChannelScratch scratch;
  const std::int64_t c = channel_of_block();
  const int rank = rank_in_channel();
  const Moments m = channel_moments<T, N>(x, s, c, rank, scratch);
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

// Blocks per channel for the streaming kernels: one per ~12k values, 1 to 8.
int streaming_blocks(const BatchNormShape& s) {
  return static_cast<int>(
      std::clamp<std::int64_t>((s.n * s.plane + kValuesPerBlock - 1) / kValuesPerBlock, 1, kMaxChannelBlocks));
}

// Blocks per channel for the resident kernels (the streaming kernels' count,
// more where the packs need them), or 0 when a channel's packs exceed what
// a cluster's threads hold.
template <typename T, int N>
int resident_blocks(const BatchNormShape& s) {
  const std::int64_t packs = s.n * (s.plane / N), per_block = std::int64_t(kChannelThreads) * resident_packs<T, N>();
  const std::int64_t needed = (packs + per_block - 1) / per_block;
  return needed > kMaxChannelBlocks ? 0 : std::max<int>(streaming_blocks(s), static_cast<int>(needed));
}

// Launches kernel(args...) with a cluster of `blocks` blocks per channel (the
// grid's x limit, 2^31 - 1 blocks, is far off); cudaLaunchKernelEx takes the
// cluster size at launch, and stream capture records it like any launch.
template <typename... Params, typename... Args>
void launch_per_channel(void (*kernel)(Params...), int blocks, const BatchNormShape& s, cudaStream_t stream,
                        Args... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(s.channels) * static_cast<unsigned>(blocks));
  config.blockDim = dim3(kChannelThreads);
  config.stream = stream;
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = static_cast<unsigned>(blocks);
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = 1;
  SG_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...));
}

// The widest pack (16, 8, 4 bytes or one value) that divides the plane and
// that every tensor's address allows; planes of a pack's values start on
// pack boundaries then (each plane's offset is a multiple of the plane).
template <typename T>
int pack_values(const BatchNormShape& s, std::initializer_list<const void*> tensors) {
  for (int bytes : {16, 8, 4}) {
    const int n = bytes / int(sizeof(T));
    if (n < 2 || s.plane % n != 0) continue;
    bool aligned = true;
    for (const void* p : tensors) aligned = aligned && (!p || reinterpret_cast<std::uintptr_t>(p) % bytes == 0);
    if (aligned) return n;
  }
  return 1;
}

void check_channel_size(const BatchNormShape& s) {
  if (s.n * s.plane > std::int64_t(0xffffffffLL))
    throw std::invalid_argument("batch_norm: " + std::to_string(s.n * s.plane) +
                                " values per channel (the kernels index a channel's values with 32 bits)");
}

// Calls f(std::integral_constant<int, N>{}) for the pack width n.
template <typename T, typename F>
void with_pack(int n, F&& f) {
  constexpr int wide = 16 / int(sizeof(T));
  if (n == wide) f(std::integral_constant<int, wide>{});
  else if (n == wide / 2) f(std::integral_constant<int, wide / 2>{});
  else if (wide >= 8 && n == wide / 4) f(std::integral_constant<int, (wide >= 8 ? wide / 4 : 1)>{});
  else f(std::integral_constant<int, 1>{});
}

}  // namespace

template <typename T>
void launch_batch_norm_forward(const T* x, const T* gamma, const T* beta, const BatchNormShape& s, T* y,
                               cudaStream_t stream, float* running_mean, float* running_var, const T* residual,
                               bool relu, const BatchNormRowsScratch& rows) {
  if (batch_norm_rows_path(s, rows))
    return launch_batch_norm_rows_forward(x, gamma, beta, s, y, stream, running_mean, running_var, residual, relu,
                                          rows);
  check_channel_size(s);
  with_pack<T>(pack_values<T>(s, {x, y, residual}), [&](auto n) {
    constexpr int N = decltype(n)::value;
    if (const int blocks = resident_blocks<T, N>(s))
      launch_per_channel(batch_norm_forward_kernel<T, N, true>, blocks, s, stream, x, gamma, beta, s, y, running_mean,
                         running_var, residual, relu);
    else
      launch_per_channel(batch_norm_forward_kernel<T, N, false>, streaming_blocks(s), s, stream, x, gamma, beta, s, y,
                         running_mean, running_var, residual, relu);
  });
  SG_LAUNCH_CHECK("batch_norm_forward_kernel");
}

template <typename T>
void launch_batch_norm_backward(const T* dy, const T* x, const T* gamma, const BatchNormShape& s, T* dx, T* dgamma,
                                T* dbeta, cudaStream_t stream, const T* relu_out, const T* dy_other,
                                const BatchNormRowsScratch& rows) {
  if (batch_norm_rows_path(s, rows))
    return launch_batch_norm_rows_backward(dy, x, gamma, s, dx, dgamma, dbeta, stream, relu_out, dy_other, rows);
  check_channel_size(s);
  with_pack<T>(pack_values<T>(s, {dy, x, dx, relu_out, dy_other}), [&](auto n) {
    constexpr int N = decltype(n)::value;
    const GradientIn<T, N> gradient{dy, dy_other, relu_out};
    if (const int blocks = resident_blocks<T, N>(s))
      launch_per_channel(batch_norm_backward_kernel<T, N, true>, blocks, s, stream, gradient, x, gamma, s, dx, dgamma,
                         dbeta);
    else
      launch_per_channel(batch_norm_backward_kernel<T, N, false>, streaming_blocks(s), s, stream, gradient, x, gamma, s,
                         dx, dgamma, dbeta);
  });
  SG_LAUNCH_CHECK("batch_norm_backward_kernel");
}

template <typename T>
void launch_batch_norm_stats_update(const T* x, const BatchNormShape& s, float* running_mean, float* running_var,
                                    cudaStream_t stream, const BatchNormRowsScratch& rows) {
  if (batch_norm_rows_path(s, rows))
    return launch_batch_norm_rows_stats_update(x, s, running_mean, running_var, stream, rows);
  check_channel_size(s);
  with_pack<T>(pack_values<T>(s, {x}), [&](auto n) {
    launch_per_channel(batch_norm_stats_kernel<T, decltype(n)::value>, streaming_blocks(s), s, stream, x, s,
                       running_mean, running_var);
  });
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
                                             float*, float*, const T*, bool, const BatchNormRowsScratch&);        \
  template void launch_batch_norm_backward<T>(const T*, const T*, const T*, const BatchNormShape&, T*, T*, T*,     \
                                              cudaStream_t, const T*, const T*, const BatchNormRowsScratch&);      \
  template void launch_batch_norm_stats_update<T>(const T*, const BatchNormShape&, float*, float*, cudaStream_t,   \
                                                  const BatchNormRowsScratch&);                                    \
  template void launch_batch_norm_inference<T>(const T*, const T*, const T*, const float*, const float*,           \
                                               const BatchNormShape&, T*, cudaStream_t);
SG_INSTANTIATE_BATCH_NORM(float)
SG_INSTANTIATE_BATCH_NORM(__half)
SG_INSTANTIATE_BATCH_NORM(__nv_bfloat16)
#undef SG_INSTANTIATE_BATCH_NORM

}  // namespace sg::cuda
