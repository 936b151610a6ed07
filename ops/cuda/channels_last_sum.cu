// Channel sums of channels-last data (see channels_last.hpp): x [rows,
// channels], sums[ch] = the sum of column ch. Block (s, g) adds rows slice s
// of channel group g. The group's channels are read in packs of V (16 bytes,
// when the channels and x's alignment allow, else one element): thread t
// takes pack t mod cols of the group on the rows t / cols, t / cols + lanes,
// ... of the slice (lanes = 256 / cols row lanes), so a warp reads whole
// rows, consecutive in memory, and kBatch loads are in flight before the
// first add waits on one. Each lane adds its rows in row order; the lanes
// then add up in a fixed tree (reduce_lanes). With one slice the block
// finishes its channels itself; else it writes its f32 partials and the last
// of the group's blocks to finish (last_block_done.cuh) adds the slices'
// partials, lane l taking slices l, l + lanes, ..., and the same tree. The
// order of the terms depends only on the shape and on V (x's alignment), so
// a launch site gets the same bits every run.
#include <algorithm>
#include <type_traits>

#include "ops/cuda/channels_last.hpp"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/last_block_done.cuh"
#include "ops/cuda/launch_config.cuh"
#include "ops/cuda/packed_access.cuh"
#include "ops/cuda/sgd_step.cuh"

namespace sg::cuda {
namespace {

constexpr int kSumThreads = 256;
// Channel packs a block covers: a group of 32 packs is a warp's width, so a
// row's packs beyond it go to another group (blockIdx.y) rather than leave
// too few row lanes for the loads in flight.
constexpr int kMaxGroupPacks = 32;
// Elements (rows x channels) a slice: about 32768, so rows = 128*14*14 of 64
// channels make 49 blocks and 128*28*28 of 32 channels 98, each thread
// with two batches of loads in flight. Slices of 8192 (196 and 392 blocks,
// one batch a thread) measured 11.5 and 11.9 us a launch on an H200 against
// 9.2 and 9.9 us for these (stepgraph profile, events around each launch):
// the last block's pass over the partials waits for every other block, so
// fewer partials shorten it. At most kMaxSlices slices.
constexpr std::int64_t kSliceElements = 32768;
constexpr std::int64_t kMaxSlices = 1024;
// Row packs a thread loads before it adds them.
constexpr int kBatch = 8;

// x [rows, channels] cut into slices of rows_per_slice rows (the last may be
// shorter) and groups of `cols` packs of V channels (the last may be narrower).
struct SumDims {
  std::int64_t rows, channels, rows_per_slice;
  int cols;
};

// Adds the row lanes' acc into lane 0's (every thread calls it: barriers
// inside). A halving tree: at each level the upper lanes [s, 2s) publish
// their V values and lanes [0, s) add them, so the order is fixed by `lanes`
// alone. `shared` holds kSumThreads * V floats.
template <int V>
__device__ __forceinline__ void reduce_lanes(float (&acc)[V], int lane, int lanes, int col, int cols, float* shared) {
  int s = 1;
  while (2 * s < lanes) s *= 2;  // lanes <= 2s
  for (; s >= 1; s /= 2) {
    if (lane >= s && lane < 2 * s && lane < lanes)
#pragma unroll
      for (int e = 0; e < V; ++e) shared[((lane - s) * cols + col) * V + e] = acc[e];
    __syncthreads();
    if (lane < s && lane + s < lanes)
#pragma unroll
      for (int e = 0; e < V; ++e) acc[e] += shared[(lane * cols + col) * V + e];
    __syncthreads();
  }
}

// This thread's share of slice blockIdx.x: rows lane, lane + lanes, ... of
// the slice, channels [first, first + V), added in row order into acc.
template <int V, typename G>
__device__ __forceinline__ void slice_rows(const G* x, const SumDims& d, int lane, int lanes, std::int64_t first,
                                           float (&acc)[V]) {
  const std::int64_t begin = std::int64_t(blockIdx.x) * d.rows_per_slice;
  const std::int64_t end = d.rows - begin < d.rows_per_slice ? d.rows : begin + d.rows_per_slice;
  const std::int64_t step = std::int64_t(lanes) * d.channels;  // elements between a lane's rows
  const G* p = x + (begin + lane) * d.channels + first;
  for (std::int64_t r = begin + lane; r < end; r += kBatch * lanes, p += kBatch * step) {
    G v[kBatch][V];
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
      if (r + b * lanes < end) load_packed<V* int(sizeof(G))>(p + b * step, v[b]);
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
      if (r + b * lanes < end)
#pragma unroll
        for (int e = 0; e < V; ++e) acc[e] += to_float(v[b][e]);
  }
}

template <int V, typename W, typename G, typename S>
__global__ void __launch_bounds__(kSumThreads)
    channels_last_sum_kernel(const G* x, SumDims d, float* partials, unsigned* finished, S* sums, W* bias, W* velocity,
                             const UpdateScalars* scalars) {
  __shared__ float shared[kSumThreads * V];
  const int lanes = kSumThreads / d.cols, lane = int(threadIdx.x) / d.cols, col = int(threadIdx.x) % d.cols;
  const std::int64_t first = (std::int64_t(blockIdx.y) * d.cols + col) * V;  // the thread's first channel
  // Threads past the last lane, or past the channels in the last group, add nothing.
  const bool active = lane < lanes && first < d.channels;
  float acc[V] = {};
  if (active) slice_rows<V>(x, d, lane, lanes, first, acc);
  reduce_lanes<V>(acc, lane, lanes, col, d.cols, shared);
  if (gridDim.x > 1) {
    if (lane == 0 && active) {
#pragma unroll
      for (int e = 0; e < V; ++e) partials[std::int64_t(blockIdx.x) * d.channels + first + e] = acc[e];
      __threadfence();  // this thread's partials visible before its block counts as done
    }
    if (!last_block_done(finished + blockIdx.y)) return;
      // The last block of the group: the slices' partials in a fixed order,
      // whatever order the blocks ran in (__ldcg: from L2, where the other
      // blocks' writes are).
#pragma unroll
    for (int e = 0; e < V; ++e) acc[e] = 0.f;
    if (active)
      for (unsigned s = unsigned(lane); s < gridDim.x; s += unsigned(lanes))
#pragma unroll
        for (int e = 0; e < V; ++e) acc[e] += __ldcg(partials + std::int64_t(s) * d.channels + first + e);
    reduce_lanes<V>(acc, lane, lanes, col, d.cols, shared);
  }
  if (lane != 0 || !active) return;
#pragma unroll
  for (int e = 0; e < V; ++e) {
    const std::int64_t ch = first + e;
    const G grad = from_float<G>(acc[e]);  // the channel_sum value the graph stores
    if (sums) sums[ch] = from_float<S>(to_float(grad));
    if (!bias) continue;
    float v = velocity ? to_float(velocity[ch]) : 0.f;
    bias[ch] = from_float<W>(sgd_step(to_float(bias[ch]), to_float(grad), velocity ? &v : nullptr, *scalars));
    if (velocity) velocity[ch] = from_float<W>(v);
  }
}

// Channel groups for packs of v channels.
std::int64_t groups_for(std::int64_t channels, int v) {
  const std::int64_t packs = channels / v, cols = std::min<std::int64_t>(packs, kMaxGroupPacks);
  return (packs + cols - 1) / cols;
}

}  // namespace

ChannelsLastSum::ChannelsLastSum(std::int64_t rows, std::int64_t channels) : rows_(rows), channels_(channels) {
  // groups_for(channels, 1) (element by element, the most groups) within a grid's y.
  if (channels < 1 || channels > std::int64_t(65535) * kMaxGroupPacks)
    throw CudaError("channels_last_sum: channels must be in [1, 65535 * 32]");
  if (rows < 0) throw CudaError("channels_last_sum: negative rows");
  // Slices from the channel count alone, whatever pack x's alignment picks
  // at launch: narrow packs only split the channels into more groups.
  rows_per_slice_ = std::max<std::int64_t>(1, kSliceElements / channels);
  std::int64_t slices = std::max<std::int64_t>(1, (rows + rows_per_slice_ - 1) / rows_per_slice_);
  if (slices > kMaxSlices) {
    rows_per_slice_ = (rows + kMaxSlices - 1) / kMaxSlices;
    slices = (rows + rows_per_slice_ - 1) / rows_per_slice_;
  }
  slices_ = static_cast<int>(slices);
  if (slices_ > 1) {
    partials_ = DeviceBuffer(static_cast<std::size_t>(channels * slices_) * sizeof(float));
    finished_ = DeviceBuffer(static_cast<std::size_t>(groups_for(channels, 1)) * sizeof(unsigned));
    finished_.fill_bytes(0);
  }
}

template <typename W, typename G, typename S>
void ChannelsLastSum::launch(const G* x, S* sums, W* bias, W* velocity, const UpdateScalars* scalars,
                             cudaStream_t stream) const {
  // 16 bytes of channels a pack when every row's pack starts aligned, else one element.
  const bool wide = channels_ % kVec<G> == 0 && aligned_to(x, 16);
  const auto run = [&](auto v) {
    constexpr int V = decltype(v)::value;
    const std::int64_t packs = channels_ / V;
    const SumDims d{rows_, channels_, rows_per_slice_, static_cast<int>(std::min<std::int64_t>(packs, kMaxGroupPacks))};
    const dim3 grid(static_cast<unsigned>(slices_), static_cast<unsigned>(groups_for(channels_, V)));
    channels_last_sum_kernel<V, W, G, S><<<grid, kSumThreads, 0, stream>>>(
        x, d, partials_.as<float>(), finished_.as<unsigned>(), sums, bias, velocity, scalars);
  };
  if (wide)
    run(std::integral_constant<int, kVec<G>>{});
  else
    run(std::integral_constant<int, 1>{});
  SG_LAUNCH_CHECK(bias ? "channels_last_sum_kernel (+sgd)" : "channels_last_sum_kernel");
}

template <typename G, typename S>
void ChannelsLastSum::sum(const G* x, S* sums, cudaStream_t stream) const {
  launch<G, G, S>(x, sums, nullptr, nullptr, nullptr, stream);
}

template <typename W, typename G>
void ChannelsLastSum::sum_sgd(const G* x, W* bias, W* velocity, const UpdateScalars* scalars,
                              cudaStream_t stream) const {
  if (!bias || !scalars) throw CudaError("channels_last_sum_sgd: needs the bias and the update scalars");
  launch<W, G, G>(x, nullptr, bias, velocity, scalars, stream);
}

#define SG_INSTANTIATE_CHANNELS_LAST_SUM(T)                                   \
  template void ChannelsLastSum::sum<T, T>(const T*, T*, cudaStream_t) const; \
  template void ChannelsLastSum::sum_sgd<T, T>(const T*, T*, T*, const UpdateScalars*, cudaStream_t) const;
SG_INSTANTIATE_CHANNELS_LAST_SUM(float)
SG_INSTANTIATE_CHANNELS_LAST_SUM(__half)
SG_INSTANTIATE_CHANNELS_LAST_SUM(__nv_bfloat16)
#undef SG_INSTANTIATE_CHANNELS_LAST_SUM
template void ChannelsLastSum::sum<__half, float>(const __half*, float*, cudaStream_t) const;
template void ChannelsLastSum::sum<__nv_bfloat16, float>(const __nv_bfloat16*, float*, cudaStream_t) const;
template void ChannelsLastSum::sum_sgd<float, __half>(const __half*, float*, float*, const UpdateScalars*,
                                                      cudaStream_t) const;
template void ChannelsLastSum::sum_sgd<float, __nv_bfloat16>(const __nv_bfloat16*, float*, float*, const UpdateScalars*,
                                                             cudaStream_t) const;

}  // namespace sg::cuda
