// Multi-tensor scale: a table of tensors in device memory (uploaded once,
// when the launch is bound), each cut into chunks of kScaleChunk elements,
// one block per chunk; a block finds its tensor by a walk over the table (a
// bucket's handful of gradients), as sgd_multi_tensor.cu does.
#include <algorithm>

#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/launch_config.cuh"
#include "ops/cuda/scale_multi_tensor.hpp"

namespace sg::cuda {
namespace {

constexpr int kScaleThreads = 256;
constexpr std::int64_t kScaleChunk = 2048;

struct ScaleEntry {
  const void* src;
  void* dst;
  std::int64_t n;
  std::int64_t first_block;
  ScaledType type;
};

template <typename T>
__device__ void scale_chunk(const void* src, void* dst, std::int64_t begin, std::int64_t end, float factor) {
  const T* x = static_cast<const T*>(src);
  T* y = static_cast<T*>(dst);
#pragma unroll 4
  for (std::int64_t i = begin + threadIdx.x; i < end; i += kScaleThreads) y[i] = from_float<T>(to_float(x[i]) * factor);
}

__global__ void __launch_bounds__(kScaleThreads)
    scale_multi_kernel(const ScaleEntry* entries, int count, float factor) {
  int e = 0;
  while (e + 1 < count && std::int64_t(blockIdx.x) >= entries[e + 1].first_block) ++e;
  const ScaleEntry entry = entries[e];
  const std::int64_t begin = (std::int64_t(blockIdx.x) - entry.first_block) * kScaleChunk;
  const std::int64_t end = begin + kScaleChunk < entry.n ? begin + kScaleChunk : entry.n;
  switch (entry.type) {
    case ScaledType::f32: scale_chunk<float>(entry.src, entry.dst, begin, end, factor); break;
    case ScaledType::f16: scale_chunk<__half>(entry.src, entry.dst, begin, end, factor); break;
    case ScaledType::bf16: scale_chunk<__nv_bfloat16>(entry.src, entry.dst, begin, end, factor); break;
  }
}

}  // namespace

ScaleMultiTensor::ScaleMultiTensor(const std::vector<ScaledTensor>& tensors, float factor)
    : count_(static_cast<int>(tensors.size())), factor_(factor) {
  if (tensors.empty()) throw CudaError("ScaleMultiTensor: no tensors");
  std::vector<ScaleEntry> entries;
  std::int64_t block = 0;
  for (const auto& t : tensors) {
    entries.push_back({t.src, t.dst, t.n, block, t.type});
    block += std::max<std::int64_t>(1, (t.n + kScaleChunk - 1) / kScaleChunk);
  }
  blocks_ = static_cast<int>(block);
  table_ = DeviceBuffer(entries.size() * sizeof(ScaleEntry));
  table_.upload(entries.data(), entries.size() * sizeof(ScaleEntry));
}

void ScaleMultiTensor::launch(cudaStream_t stream) const {
  scale_multi_kernel<<<blocks_, kScaleThreads, 0, stream>>>(table_.as<ScaleEntry>(), count_, factor_);
  SG_LAUNCH_CHECK("scale_multi_kernel");
}

}  // namespace sg::cuda
