// The clip_grad_norm_ factor and the gradient scaling it drives. The
// formulas are PyTorch's and those of ops/cpu/reference_ops.hpp; the clip
// scale, which changes between graph replays, is read from device memory.
#include <algorithm>

#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/last_block_done.cuh"
#include "ops/cuda/launch_config.cuh"
#include "ops/cuda/optimizer_kernels.hpp"

namespace sg::cuda {
namespace {

struct ClipEntry {
  const void* data;
  std::int64_t n;
  std::int64_t first_block;
  int type;
};

constexpr int kClipThreads = 256;
constexpr std::int64_t kClipChunk = kClipThreads * 32;

template <typename T>
__device__ float sum_squares(const T* x, std::int64_t begin, std::int64_t end) {
  float acc = 0.f;
  for (std::int64_t i = begin + threadIdx.x; i < end; i += kClipThreads) {
    const float v = to_float(x[i]);
    acc += v * v;
  }
  return acc;
}

// Deterministic block sum (fixed tree over the block's threads).
__device__ float block_sum(float v) {
  __shared__ float warp_sums[kClipThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.f;
  if (threadIdx.x == 0)
    for (int i = 0; i < kClipThreads / 32; ++i) total += warp_sums[i];
  __syncthreads();
  return total;  // valid in thread 0
}

__global__ void __launch_bounds__(kClipThreads) clip_scale_kernel(const ClipEntry* entries, int count, float* partials,
                                                                  unsigned* finished, float max_norm, float* scale) {
  int e = 0;
  while (e + 1 < count && std::int64_t(blockIdx.x) >= entries[e + 1].first_block) ++e;
  const ClipEntry entry = entries[e];
  const std::int64_t begin = (std::int64_t(blockIdx.x) - entry.first_block) * kClipChunk;
  const std::int64_t end = begin + kClipChunk < entry.n ? begin + kClipChunk : entry.n;
  float acc = 0.f;
  if (entry.type == 0) acc = sum_squares(static_cast<const float*>(entry.data), begin, end);
  else if (entry.type == 1) acc = sum_squares(static_cast<const __half*>(entry.data), begin, end);
  else acc = sum_squares(static_cast<const __nv_bfloat16*>(entry.data), begin, end);
  const float block_total = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = block_total;
  if (!last_block_done(finished)) return;
  // The last block adds the partials in block order: the same bits every run.
  if (threadIdx.x == 0) {
    float sum = 0.f;
    for (unsigned b = 0; b < gridDim.x; ++b) sum += __ldcg(partials + b);
    *scale = fminf(1.f, max_norm / (sqrtf(sum) + 1e-6f));
  }
}

template <typename T>
__global__ void scale_grad_kernel(const T* x, const float* scale, std::int64_t n, T* y) {
  const float s = *scale;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    y[i] = from_float<T>(to_float(x[i]) * s);
}

}  // namespace

ClipScale::ClipScale(const std::vector<ClipInput>& inputs, float max_norm)
    : count_(static_cast<int>(inputs.size())), max_norm_(max_norm) {
  if (inputs.empty()) throw CudaError("ClipScale: no gradients");
  std::vector<ClipEntry> entries;
  std::int64_t block = 0;
  for (const auto& in : inputs) {
    entries.push_back({in.data, in.n, block, in.type});
    block += std::max<std::int64_t>(1, (in.n + kClipChunk - 1) / kClipChunk);
  }
  blocks_ = static_cast<int>(block);
  table_ = DeviceBuffer(entries.size() * sizeof(ClipEntry));
  table_.upload(entries.data(), entries.size() * sizeof(ClipEntry));
  partials_ = DeviceBuffer(static_cast<std::size_t>(blocks_) * sizeof(float));
  finished_ = DeviceBuffer(sizeof(unsigned));
  finished_.fill_bytes(0);
}

void ClipScale::launch(float* scale, cudaStream_t stream) const {
  clip_scale_kernel<<<blocks_, kClipThreads, 0, stream>>>(table_.as<ClipEntry>(), count_, partials_.as<float>(),
                                                          finished_.as<unsigned>(), max_norm_, scale);
  SG_LAUNCH_CHECK("clip_scale_kernel");
}

template <typename T>
void launch_scale_grad(const T* x, const float* scale, std::int64_t n, T* y, cudaStream_t stream) {
  scale_grad_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, scale, n, y);
  SG_LAUNCH_CHECK("scale_grad_kernel");
}

template void launch_scale_grad<float>(const float*, const float*, std::int64_t, float*, cudaStream_t);
template void launch_scale_grad<__half>(const __half*, const float*, std::int64_t, __half*, cudaStream_t);
template void launch_scale_grad<__nv_bfloat16>(const __nv_bfloat16*, const float*, std::int64_t, __nv_bfloat16*, cudaStream_t);

}  // namespace sg::cuda
