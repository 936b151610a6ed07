// Multi-tensor SGD: a table of tensors in device memory (uploaded once, when
// the launch is bound), each tensor cut into chunks of kSgdChunk elements, one
// block per chunk; a block finds its tensor by a walk over the table (a
// handful of entries: the convolution weights of a CNN).
#include <algorithm>

#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/launch_config.cuh"
#include "ops/cuda/sgd_multi_tensor.hpp"
#include "ops/cuda/sgd_step.cuh"

namespace sg::cuda {
namespace {

// Four elements per thread: a small network's ~400k parameters make ~400
// blocks, enough to keep every SM streaming (chunks of 4096 left a third of
// them idle and each thread's loads in series).
constexpr int kSgdThreads = 256;
constexpr std::int64_t kSgdChunk = 1024;

struct SgdEntry {
  void* w;
  const void* g;
  void* velocity;
  std::int64_t n;
  const UpdateScalars* scalars;
  std::int64_t first_block;
  bool nesterov;
  GradientOrder order;
};

template <typename W, typename G>
__global__ void __launch_bounds__(kSgdThreads)
    sgd_multi_kernel(const SgdEntry* entries, int count, std::int32_t* advance_step) {
  if (advance_step && blockIdx.x == 0 && threadIdx.x == 0) *advance_step += 1;
  int e = 0;
  while (e + 1 < count && std::int64_t(blockIdx.x) >= entries[e + 1].first_block) ++e;
  const SgdEntry entry = entries[e];
  W* w = static_cast<W*>(entry.w);
  const G* g = static_cast<const G*>(entry.g);
  W* velocity = static_cast<W*>(entry.velocity);
  const UpdateScalars s = *entry.scalars;
  const std::int64_t begin = (std::int64_t(blockIdx.x) - entry.first_block) * kSgdChunk;
  const std::int64_t end = begin + kSgdChunk < entry.n ? begin + kSgdChunk : entry.n;
#pragma unroll 4
  for (std::int64_t i = begin + threadIdx.x; i < end; i += kSgdThreads) {
    float v = velocity ? to_float(velocity[i]) : 0.f;
    const float gi = to_float(g[entry.order.index(i)]);
    w[i] = from_float<W>(entry.nesterov ? sgd_nesterov_step(to_float(w[i]), gi, v, s)
                                        : sgd_step(to_float(w[i]), gi, velocity ? &v : nullptr, s));
    if (velocity) velocity[i] = from_float<W>(v);
  }
}

}  // namespace

template <typename W, typename G>
SgdMultiTensor<W, G>::SgdMultiTensor(const std::vector<SgdTensor<W, G>>& tensors)
    : count_(static_cast<int>(tensors.size())) {
  if (tensors.empty()) throw CudaError("SgdMultiTensor: no tensors");
  std::vector<SgdEntry> entries;
  std::int64_t block = 0;
  for (const auto& t : tensors) {
    entries.push_back({t.w, t.g, t.velocity, t.n, t.scalars, block, t.nesterov, t.order});
    block += std::max<std::int64_t>(1, (t.n + kSgdChunk - 1) / kSgdChunk);
  }
  blocks_ = static_cast<int>(block);
  table_ = DeviceBuffer(entries.size() * sizeof(SgdEntry));
  table_.upload(entries.data(), entries.size() * sizeof(SgdEntry));
}

template <typename W, typename G>
void SgdMultiTensor<W, G>::launch(cudaStream_t stream, std::int32_t* advance_step) const {
  sgd_multi_kernel<W, G><<<blocks_, kSgdThreads, 0, stream>>>(table_.as<SgdEntry>(), count_, advance_step);
  SG_LAUNCH_CHECK("sgd_multi_kernel");
}

template class SgdMultiTensor<float, float>;
template class SgdMultiTensor<__half, __half>;
template class SgdMultiTensor<float, __half>;
template class SgdMultiTensor<__nv_bfloat16, __nv_bfloat16>;
template class SgdMultiTensor<float, __nv_bfloat16>;

}  // namespace sg::cuda
