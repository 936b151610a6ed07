// Channel sums (see channel_sum.hpp). Block (s, c) adds slice s of channel
// c: thread t takes elements t, t + 256, ... of the slice (consecutive
// threads read consecutive addresses within a plane), then the block adds
// its threads' partials by warp shuffles and the first warp, in a fixed
// order. With one slice per channel the block finishes the channel itself.
#include <algorithm>

#include "ops/cuda/channel_sum.hpp"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/launch_config.cuh"
#include "ops/cuda/sgd_step.cuh"
#include "ops/cuda/warp_reduce.cuh"

namespace sg::cuda {
namespace {

constexpr int kChannelThreads = 256;

struct ChannelDims {
  std::int64_t n, channels, plane;
};

// The sum of slice blockIdx.x of channel blockIdx.y, valid in thread 0.
template <typename G>
__device__ float slice_sum(const G* x, ChannelDims d) {
  const std::int64_t c = blockIdx.y, total = d.n * d.plane;
  const std::int64_t begin = std::int64_t(blockIdx.x) * kChannelSliceElements;
  const std::int64_t end = begin + kChannelSliceElements < total ? begin + kChannelSliceElements : total;
  float acc = 0.f;
#pragma unroll 4
  for (std::int64_t k = begin + threadIdx.x; k < end; k += kChannelThreads)
    acc += to_float(x[((k / d.plane) * d.channels + c) * d.plane + k % d.plane]);
  __shared__ float warp_partial[kChannelThreads / 32];
  acc = warp_sum(acc);
  if (threadIdx.x % 32 == 0) warp_partial[threadIdx.x / 32] = acc;
  __syncthreads();
  float sum = 0.f;
  if (threadIdx.x < 32) sum = warp_sum(threadIdx.x < kChannelThreads / 32 ? warp_partial[threadIdx.x] : 0.f);
  return sum;
}

// Whether this block is the last of its channel's slices to finish; then
// `total` (thread 0) is the channel's sum, its partials added in slice order.
__device__ bool channel_total(float block_sum, float* partials, unsigned* finished, float& total) {
  const unsigned slices = gridDim.x;
  if (slices == 1) {
    total = block_sum;
    return true;
  }
  const std::int64_t c = blockIdx.y;
  __shared__ bool last;
  if (threadIdx.x == 0) {
    partials[c * slices + blockIdx.x] = block_sum;
    __threadfence();  // the partial is visible before the count says so
    last = atomicAdd(finished + c, 1u) == slices - 1;
    if (last) finished[c] = 0;  // ready for the next launch (graph replay)
  }
  __syncthreads();
  if (!last) return false;
  if (threadIdx.x == 0) {
    total = 0.f;
    for (unsigned s = 0; s < slices; ++s) total += __ldcg(partials + c * slices + s);
  }
  return true;
}

template <typename W, typename G, typename S>
__global__ void __launch_bounds__(kChannelThreads)
    channel_sum_kernel(const G* x, ChannelDims d, float* partials, unsigned* finished, S* sums, W* bias, W* velocity,
                       const UpdateScalars* scalars) {
  float total = 0.f;
  if (!channel_total(slice_sum(x, d), partials, finished, total) || threadIdx.x != 0) return;
  const std::int64_t c = blockIdx.y;
  const G grad = from_float<G>(total);  // the channel_sum value the graph stores
  if (sums) sums[c] = from_float<S>(to_float(grad));
  if (!bias) return;
  float v = velocity ? to_float(velocity[c]) : 0.f;
  bias[c] = from_float<W>(sgd_step(to_float(bias[c]), to_float(grad), velocity ? &v : nullptr, *scalars));
  if (velocity) velocity[c] = from_float<W>(v);
}

}  // namespace

ChannelSum::ChannelSum(std::int64_t n, std::int64_t channels, std::int64_t plane)
    : n_(n), channels_(channels), plane_(plane) {
  if (channels < 1 || channels > 65535) throw CudaError("channel_sum: channels must be in [1, 65535]");
  slices_ = static_cast<int>(std::max<std::int64_t>(1, (n * plane + kChannelSliceElements - 1) / kChannelSliceElements));
  if (slices_ > 1) {
    partials_ = DeviceBuffer(static_cast<std::size_t>(channels * slices_) * sizeof(float));
    finished_ = DeviceBuffer(static_cast<std::size_t>(channels) * sizeof(unsigned));
    finished_.fill_bytes(0);
  }
}

template <typename G, typename S>
void ChannelSum::sum(const G* x, S* sums, cudaStream_t stream) const {
  const dim3 grid(static_cast<unsigned>(slices_), static_cast<unsigned>(channels_));
  channel_sum_kernel<G, G, S><<<grid, kChannelThreads, 0, stream>>>(x, {n_, channels_, plane_}, partials_.as<float>(),
                                                                  finished_.as<unsigned>(), sums, nullptr, nullptr,
                                                                  nullptr);
  SG_LAUNCH_CHECK("channel_sum_kernel");
}

template <typename W, typename G>
void ChannelSum::sum_sgd(const G* x, W* bias, W* velocity, const UpdateScalars* scalars, cudaStream_t stream) const {
  const dim3 grid(static_cast<unsigned>(slices_), static_cast<unsigned>(channels_));
  channel_sum_kernel<W, G, G><<<grid, kChannelThreads, 0, stream>>>(x, {n_, channels_, plane_}, partials_.as<float>(),
                                                                     finished_.as<unsigned>(), nullptr, bias, velocity,
                                                                  scalars);
  SG_LAUNCH_CHECK("channel_sum_kernel (+sgd)");
}

#define SG_INSTANTIATE_CHANNEL_SUM(T)                                       \
  template void ChannelSum::sum<T, T>(const T*, T*, cudaStream_t) const; \
  template void ChannelSum::sum_sgd<T, T>(const T*, T*, T*, const UpdateScalars*, cudaStream_t) const;
SG_INSTANTIATE_CHANNEL_SUM(float)
SG_INSTANTIATE_CHANNEL_SUM(__half)
SG_INSTANTIATE_CHANNEL_SUM(__nv_bfloat16)
#undef SG_INSTANTIATE_CHANNEL_SUM
template void ChannelSum::sum<__half, float>(const __half*, float*, cudaStream_t) const;
template void ChannelSum::sum<__nv_bfloat16, float>(const __nv_bfloat16*, float*, cudaStream_t) const;
template void ChannelSum::sum_sgd<float, __half>(const __half*, float*, float*, const UpdateScalars*, cudaStream_t) const;
template void ChannelSum::sum_sgd<float, __nv_bfloat16>(const __nv_bfloat16*, float*, float*, const UpdateScalars*,
                                                        cudaStream_t) const;

}  // namespace sg::cuda
