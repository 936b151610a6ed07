// Channel sums (see channel_sum.hpp). Block (s, c) adds slice s of channel
// c: whole planes of consecutive images (or, for a plane larger than a
// slice, one segment of one image's plane). The slice's elements are read in
// packs of V (16, 8, 4 bytes, or one element, the widest that the plane's
// size and x's alignment allow, so every pack of every image is aligned):
// thread t takes packs t, t + 256, ... of the slice in (image, pack) order,
// stepping through images without a division per pack, kBatch loads in
// flight at a time (one at a time, each add would wait out a trip to DRAM);
// consecutive threads read consecutive packs of a plane. The block then adds
// its threads' partials (block_sum.cuh: a fixed order). With one slice per
// channel the block finishes the channel itself; else the last of the
// channel's blocks adds the slices' partials, all its threads reading them.
// The order of the terms depends only on the shape and on V (x's alignment),
// so a launch site (one x pointer) gets the same bits every run.
#include <algorithm>
#include <type_traits>

#include "ops/cuda/channel_sum.hpp"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/launch_config.cuh"
#include "ops/cuda/packed_access.cuh"
#include "ops/cuda/sgd_step.cuh"
#include "ops/cuda/block_sum.cuh"

namespace sg::cuda {
namespace {

constexpr int kChannelThreads = 256;
// Packs of V elements a thread loads before it adds them: a whole slice's
// share (kChannelSliceElements / kChannelThreads elements) in one round trip.
template <int V>
constexpr int kBatch = std::max<int>(1, int(kChannelSliceElements / kChannelThreads) / V);

// x [n, channels, plane] cut into slices: `images_per_slice` whole planes
// each (segments == 1), or one `segment`-element piece of one plane each
// (images_per_slice == 1; every segment but a plane's last `segment` long).
struct ChannelDims {
  std::int64_t n, channels, plane;
  int images_per_slice, segments, segment;
};

// The sum of slice blockIdx.x of channel blockIdx.y, read V elements at a
// time (every thread gets it; `shared`: block_sum's).
template <int V, typename G>
__device__ float slice_sum(const G* x, const ChannelDims& d, float* shared) {
  const std::int64_t c = blockIdx.y;
  std::int64_t image0 = 0;  // the slice's first image
  int images = 1, begin = 0, length = 0;  // images, and the elements [begin, begin + length) of each plane
  if (d.segments == 1) {
    image0 = std::int64_t(blockIdx.x) * d.images_per_slice;
    const std::int64_t left = d.n - image0;  // images from the slice's first on
    images = left < d.images_per_slice ? int(left) : d.images_per_slice;
    length = int(d.plane);
  } else {
    const unsigned segment = blockIdx.x % unsigned(d.segments);
    image0 = blockIdx.x / unsigned(d.segments);
    begin = int(segment) * d.segment;
    length = d.plane - begin < d.segment ? int(d.plane - begin) : d.segment;
  }
  // V divides the plane and the segment: every pack lies in one plane and
  // (x aligned to V elements) is aligned.
  const int per_image = length / V, packs = images * per_image;
  float acc = 0.f;
  if (packs > 0) {
    const std::int64_t image_stride = d.channels * d.plane;
    const G* first = x + (image0 * d.channels + c) * d.plane + begin;
    // Thread t's pack (image, at), advanced by kChannelThreads packs a step:
    // the one division per thread.
    int image = int(threadIdx.x) / per_image, at = int(threadIdx.x) - image * per_image;
    const int step_images = kChannelThreads / per_image, step_packs = kChannelThreads - step_images * per_image;
    for (int k = int(threadIdx.x); k < packs; k += kBatch<V> * kChannelThreads) {
      // kBatch loads in flight before the first add waits on one.
      G v[kBatch<V>][V];
#pragma unroll
      for (int b = 0; b < kBatch<V>; ++b) {
        if (k + b * kChannelThreads < packs)
          load_packed<V * int(sizeof(G))>(first + image * image_stride + at * V, v[b]);
        image += step_images;
        at += step_packs;
        if (at >= per_image) {
          at -= per_image;
          ++image;
        }
      }
#pragma unroll
      for (int b = 0; b < kBatch<V>; ++b)
        if (k + b * kChannelThreads < packs)
#pragma unroll
          for (int e = 0; e < V; ++e) acc += to_float(v[b][e]);
    }
  }
  return block_sum<kChannelThreads>(acc, shared);
}

// Whether this block is the last of its channel's slices to finish; then
// `total` is the channel's sum: the slices' partials, read by all threads at
// once and added by block_sum (a fixed order, whatever order the blocks ran in).
__device__ bool channel_total(float block_sum_value, float* partials, unsigned* finished, float* shared,
                              float& total) {
  const unsigned slices = gridDim.x;
  if (slices == 1) {
    total = block_sum_value;
    return true;
  }
  const std::int64_t c = blockIdx.y;
  __shared__ bool last;
  if (threadIdx.x == 0) {
    partials[c * slices + blockIdx.x] = block_sum_value;
    __threadfence();  // the partial is visible before the count says so
    last = atomicAdd(finished + c, 1u) == slices - 1;
    if (last) finished[c] = 0;  // ready for the next launch (graph replay)
  }
  __syncthreads();
  if (!last) return false;
  float p = 0.f;
  for (unsigned s = threadIdx.x; s < slices; s += kChannelThreads) p += __ldcg(partials + c * slices + s);
  total = block_sum<kChannelThreads>(p, shared);
  return true;
}

template <int V, typename W, typename G, typename S>
__global__ void __launch_bounds__(kChannelThreads)
    channel_sum_kernel(const G* x, ChannelDims d, float* partials, unsigned* finished, S* sums, W* bias, W* velocity,
                       const UpdateScalars* scalars) {
  __shared__ float shared[kChannelThreads / 32];
  float total = 0.f;
  if (!channel_total(slice_sum<V>(x, d, shared), partials, finished, shared, total) || threadIdx.x != 0) return;
  const std::int64_t c = blockIdx.y;
  const G grad = from_float<G>(total);  // the channel_sum value the graph stores
  if (sums) sums[c] = from_float<S>(to_float(grad));
  if (!bias) return;
  float v = velocity ? to_float(velocity[c]) : 0.f;
  bias[c] = from_float<W>(sgd_step(to_float(bias[c]), to_float(grad), velocity ? &v : nullptr, *scalars));
  if (velocity) velocity[c] = from_float<W>(v);
}

// The widest pack (elements of G, at most 16 bytes) that divides the plane
// and the segment and that x is aligned to.
template <typename G>
int pack_elements(const G* x, std::int64_t plane, int segment) {
  for (int v = 16 / int(sizeof(G)); v > 1; v /= 2)
    if (plane % v == 0 && segment % v == 0 && aligned_to(x, v * int(sizeof(G)))) return v;
  return 1;
}

// f(std::integral_constant<int, V>) for the pack width v.
template <typename G, typename F>
void with_pack(int v, F&& f) {
  if constexpr (sizeof(G) == 2) {
    if (v == 8) return f(std::integral_constant<int, 8>{});
  }
  if (v == 4) return f(std::integral_constant<int, 4>{});
  if (v == 2) return f(std::integral_constant<int, 2>{});
  f(std::integral_constant<int, 1>{});
}

}  // namespace

ChannelSum::ChannelSum(std::int64_t n, std::int64_t channels, std::int64_t plane)
    : n_(n), channels_(channels), plane_(plane) {
  if (channels < 1 || channels > 65535) throw CudaError("channel_sum: channels must be in [1, 65535]");
  if (n < 0 || plane < 0) throw CudaError("channel_sum: negative size");
  std::int64_t slices = 1;
  if (plane <= kChannelSliceElements) {
    // Whole planes: as many as fit a slice (at least one).
    images_per_slice_ = static_cast<int>(kChannelSliceElements / std::max<std::int64_t>(plane, 1));
    segment_ = static_cast<int>(plane);
    slices = (n + images_per_slice_ - 1) / images_per_slice_;
  } else {
    // Segments of at most about a slice, a multiple of 8 elements long so
    // every segment starts on a 16-byte boundary when its plane does.
    const std::int64_t pieces = (plane + kChannelSliceElements - 1) / kChannelSliceElements;
    segment_ = static_cast<int>(((plane + pieces - 1) / pieces + 7) / 8 * 8);
    segments_ = static_cast<int>((plane + segment_ - 1) / segment_);
    slices = n * segments_;
  }
  if (slices > INT32_MAX) throw CudaError("channel_sum: too many slices");
  slices_ = static_cast<int>(std::max<std::int64_t>(1, slices));
  if (slices_ > 1) {
    partials_ = DeviceBuffer(static_cast<std::size_t>(channels * slices_) * sizeof(float));
    finished_ = DeviceBuffer(static_cast<std::size_t>(channels) * sizeof(unsigned));
    finished_.fill_bytes(0);
  }
}

template <typename G, typename S>
void ChannelSum::sum(const G* x, S* sums, cudaStream_t stream) const {
  const dim3 grid(static_cast<unsigned>(slices_), static_cast<unsigned>(channels_));
  const ChannelDims d{n_, channels_, plane_, images_per_slice_, segments_, segment_};
  with_pack<G>(pack_elements(x, plane_, segment_), [&](auto v) {
    channel_sum_kernel<decltype(v)::value, G, G, S><<<grid, kChannelThreads, 0, stream>>>(
        x, d, partials_.as<float>(), finished_.as<unsigned>(), sums, nullptr, nullptr, nullptr);
  });
  SG_LAUNCH_CHECK("channel_sum_kernel");
}

template <typename W, typename G>
void ChannelSum::sum_sgd(const G* x, W* bias, W* velocity, const UpdateScalars* scalars, cudaStream_t stream) const {
  const dim3 grid(static_cast<unsigned>(slices_), static_cast<unsigned>(channels_));
  const ChannelDims d{n_, channels_, plane_, images_per_slice_, segments_, segment_};
  with_pack<G>(pack_elements(x, plane_, segment_), [&](auto v) {
    channel_sum_kernel<decltype(v)::value, W, G, G><<<grid, kChannelThreads, 0, stream>>>(
        x, d, partials_.as<float>(), finished_.as<unsigned>(), nullptr, bias, velocity, scalars);
  });
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
