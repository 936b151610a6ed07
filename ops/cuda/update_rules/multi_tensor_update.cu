// The multi-tensor update over any rule (multi_tensor_update.hpp). Adam's
// launch is what it was before the rules (issue 21): the same loads and
// arithmetic, so the same bits.
#include <algorithm>
#include <type_traits>

#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/dependent_launch.cuh"
#include "ops/cuda/last_block_done.cuh"
#include "ops/cuda/launch_config.cuh"
#include "ops/cuda/quad_access.cuh"
#include "ops/cuda/update_rules/all_rules.cuh"
#include "ops/cuda/update_rules/each_slot.cuh"
#include "ops/cuda/update_rules/multi_tensor_update.hpp"

namespace sg::cuda {
namespace {

constexpr int kUpdateThreads = 256;
// Elements per block: where the launch has over kSmallUpdate elements, up to
// 16 a thread (four quads in turn), fewer where that would leave resident
// block slots empty: the quads a thread takes are as many as one wave of
// resident blocks needs to cover the launch (on an H200, 1056 blocks of 1024
// elements a quad: 784-1024-1024-10's 1.8M two, a 2048 x 2048 layer's 4.2M
// four; docs/performance.md section 49). Before, every large launch took four, and
// a 784 x 2048 layer's update alone (1.6M) filled 392 of 1056 block slots of
// an H200, its loads too few in flight for the bandwidth. Else 4 a thread
// (one quad: a block is one memory round trip): a CNN's convolution weights
// (~100k elements) made ~30 blocks of four round trips each, 8-10 us a launch
// at the end of the step; SGD's kernel uses 1024 too.
constexpr std::int64_t kQuadChunk = kUpdateThreads * 4;
constexpr std::int64_t kMaxQuadsPerThread = 4;
constexpr std::int64_t kSmallUpdate = std::int64_t(1) << 20;

struct UpdateEntry {
  void* w;
  const void* g;
  StateSlots state;
  std::int64_t n;
  std::int64_t first_block;
  GradientOrder order;
  ComputeCopy copy;
};

// The compute copy of `count` consecutive updated values at element i (count 4: one 8-byte store).
template <typename W, int count>
__device__ __forceinline__ void store_copy(const ComputeCopy& copy, std::int64_t i, const W* values) {
  const auto store = [&](auto* target) {
    using C = std::remove_pointer_t<decltype(target)>;
    C packed[count];
#pragma unroll
    for (int k = 0; k < count; ++k) packed[k] = from_float<C>(to_float(values[k]));
    if constexpr (count == 4) store_packed<4 * int(sizeof(C))>(target + i, packed);
    else target[i] = packed[0];
  };
  if (copy.type == CopyType::f16) store(static_cast<__half*>(copy.data));
  else if (copy.type == CopyType::bf16) store(static_cast<__nv_bfloat16*>(copy.data));
}

__device__ __forceinline__ bool aligned(const void* p, int bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }

// kCopies: some tensor has a compute copy (a launch without any runs the
// kernel it ran before copies existed, instruction for instruction).
template <class Rule, typename W, typename G, bool kCopies>
__global__ void __launch_bounds__(kUpdateThreads) multi_tensor_update_kernel(const UpdateEntry* entries, int count,
                                                                           const UpdateScalars* scalars,
                                                                           const std::int32_t* step,
                                                                           const float* clip_scale, HyperOf<Rule> hyper,
                                                                           std::int32_t* advance_step,
                                                                           unsigned* finished, std::int64_t chunk) {
  constexpr int S = Rule::kStates;
  wait_for_previous_kernel();  // (a dependent launch: the gradients come from the kernels before)
  int e = 0;
  while (e + 1 < count && std::int64_t(blockIdx.x) >= entries[e + 1].first_block) ++e;
  const UpdateEntry entry = entries[e];
  const Rule rule(hyper, scalars->lr, step, clip_scale);
  W* w = static_cast<W*>(entry.w);
  const G* g = static_cast<const G*>(entry.g);
  const std::int64_t begin = (std::int64_t(blockIdx.x) - entry.first_block) * chunk;
  const std::int64_t end = begin + chunk < entry.n ? begin + chunk : entry.n;
  // A permuted gradient is gathered an element at a time; W and the slots
  // keep their 16-byte accesses.
  const bool permuted = entry.order.permuted();
  const bool vector = entry.n % 4 == 0 && aligned(w, 4 * sizeof(W)) && (permuted || aligned(g, 4 * sizeof(G))) &&
                      slots_aligned16<Rule>(entry.state, hyper) && (!kCopies || aligned(entry.copy.data, 8));
  if (vector) {
    // At the copy bandwidth (one read and one write of W and the slots, one
    // read of the gradient); loading every quad first and L2 evict-last hints
    // on W, m and v measured slower on the H100 for Adam (18.3 vs 13.7 us for
    // 784-1024-1024-10).
    for (std::int64_t i = begin + 4 * threadIdx.x; i < end; i += 4 * kUpdateThreads) {
      Quad<W> wq = load_quad(w + i);
      Quad<G> gq;
      if (permuted) {
#pragma unroll
        for (int k = 0; k < 4; ++k) gq.v[k] = g[entry.order.index(i + k)];
      } else {
        gq = load_quad(g + i);
      }
      Quad<float> sq[S];
      each_slot<Rule>(hyper, [&](auto slot) { sq[slot.value] = load_quad(entry.state.slot[slot.value] + i); });
#pragma unroll
      for (int k = 0; k < 4; ++k)
        wq.v[k] = from_float<W>(rule(to_float(wq.v[k]), to_float(gq.v[k]), [&](int s) -> float& { return sq[s].v[k]; }));
      store_quad(w + i, wq);
      if constexpr (kCopies) store_copy<W, 4>(entry.copy, i, wq.v);
      each_slot<Rule>(hyper, [&](auto slot) { store_quad(entry.state.slot[slot.value] + i, sq[slot.value]); });
    }
  } else {
    for (std::int64_t i = begin + threadIdx.x; i < end; i += kUpdateThreads) {
      float st[S];
      each_slot<Rule>(hyper, [&](auto slot) { st[slot.value] = entry.state.slot[slot.value][i]; });
      w[i] = from_float<W>(
          rule(to_float(w[i]), to_float(g[entry.order.index(i)]), [&](int s) -> float& { return st[s]; }));
      if constexpr (kCopies) store_copy<W, 1>(entry.copy, i, w + i);
      each_slot<Rule>(hyper, [&](auto slot) { entry.state.slot[slot.value][i] = st[slot.value]; });
    }
  }
  if (advance_step && last_block_done(finished) && threadIdx.x == 0) *advance_step += 1;
}

// The kernel a launch runs: with the copies' stores compiled in where some tensor has a copy.
template <class Rule, typename W, typename G>
auto update_kernel(bool copies) {
  return copies ? multi_tensor_update_kernel<Rule, W, G, true> : multi_tensor_update_kernel<Rule, W, G, false>;
}

}  // namespace

template <class Rule, typename W, typename G>
MultiTensorUpdate<Rule, W, G>::MultiTensorUpdate(const std::vector<UpdateTensor<W, G>>& tensors, HyperOf<Rule> hyper)
    : count_(static_cast<int>(tensors.size())), hyper_(hyper) {
  if (tensors.empty()) throw CudaError("MultiTensorUpdate: no tensors");
  std::int64_t elements = 0;
  for (const auto& t : tensors) {
    if (t.copy.type != CopyType::none && !std::is_same_v<W, float>)
      throw CudaError("MultiTensorUpdate: a compute copy is written from fp32 master weights only");
    elements += t.n;
    copies_ = copies_ || t.copy.type != CopyType::none;
  }
  chunk_ = kQuadChunk;
  if (elements > kSmallUpdate) {
    int per_sm = 0;
    SG_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, update_kernel<Rule, W, G>(copies_), kUpdateThreads, 0));
    const std::int64_t wave = std::int64_t(std::max(per_sm, 1)) * multiprocessor_count() * kQuadChunk;
    chunk_ = kQuadChunk * std::clamp<std::int64_t>((elements + wave - 1) / wave, 1, kMaxQuadsPerThread);
  }
  std::vector<UpdateEntry> entries;
  std::int64_t block = 0;
  for (const auto& t : tensors) {
    entries.push_back({t.w, t.g, t.state, t.n, block, t.order, t.copy});
    block += std::max<std::int64_t>(1, (t.n + chunk_ - 1) / chunk_);
  }
  blocks_ = static_cast<int>(block);
  table_ = DeviceBuffer(entries.size() * sizeof(UpdateEntry));
  table_.upload(entries.data(), entries.size() * sizeof(UpdateEntry));
  finished_ = DeviceBuffer(sizeof(unsigned));
  finished_.fill_bytes(0);
}

template <class Rule, typename W, typename G>
void MultiTensorUpdate<Rule, W, G>::launch(const UpdateScalars* scalars, const std::int32_t* step,
                                           const float* clip_scale, std::int32_t* advance_step, cudaStream_t stream,
                                           bool dependent) const {
  launch_dependent(update_kernel<Rule, W, G>(copies_), {dim3(blocks_), dim3(kUpdateThreads)}, stream, dependent,
                   table_.as<UpdateEntry>(), count_, scalars, step, clip_scale, hyper_, advance_step,
                   finished_.as<unsigned>(), chunk_);
}

#define SG_MULTI_TENSOR_TYPES(Rule)                         \
  template class MultiTensorUpdate<Rule, float, float>;     \
  template class MultiTensorUpdate<Rule, __half, __half>;   \
  template class MultiTensorUpdate<Rule, float, __half>;    \
  template class MultiTensorUpdate<Rule, __nv_bfloat16, __nv_bfloat16>; \
  template class MultiTensorUpdate<Rule, float, __nv_bfloat16>;
SG_FOR_EACH_UPDATE_RULE(SG_MULTI_TENSOR_TYPES)
#undef SG_MULTI_TENSOR_TYPES

}  // namespace sg::cuda
