// One launch casting several fp32 tensors: the tensors' blocks are laid end
// to end over the grid, and each block finds its tensor by the prefix of
// block counts held in the kernel's parameter (no device-side table). A
// thread casts kPack consecutive elements: one 16-byte load and one 8-byte
// store where the tensor's pointers allow (a warp reads 512 contiguous
// bytes), else (and for a tensor's last elements) one element at a time.
// One element per thread took 5.8 us for mnist_cnn_fast's 455k parameters
// on an H200 (1780 blocks, two waves of one load each); every element is
// rounded on its own either way, so the bits are the same.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "ops/cuda/cast_params.hpp"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/launch_config.cuh"
#include "ops/cuda/packed_access.cuh"

namespace sg::cuda {
namespace {

constexpr int kPack = 4;
constexpr std::int64_t kPackBlockElements = std::int64_t(kThreads) * kPack;

template <typename T>
struct alignas(8) PackOf4 {
  T v[kPack];
};

template <typename T>
struct CastBatch {
  CastTensor<T> tensors[kCastTensorsPerLaunch];
  int first_block[kCastTensorsPerLaunch + 1];  // block index where tensor i starts
  std::uint32_t wide = 0;                       // bit i: tensor i's source is 16-byte and target 8-byte aligned
  int size = 0;
};
static_assert(kCastTensorsPerLaunch <= 32, "CastBatch::wide has a bit per tensor");

template <typename T>
__global__ void __launch_bounds__(kThreads) cast_params_kernel(const CastBatch<T> batch) {
  int t = 0;
  while (t + 1 < batch.size && static_cast<int>(blockIdx.x) >= batch.first_block[t + 1]) ++t;
  const CastTensor<T>& tensor = batch.tensors[t];
  const std::int64_t first =
      static_cast<std::int64_t>(blockIdx.x - batch.first_block[t]) * kPackBlockElements + threadIdx.x * kPack;
  if (first >= tensor.count) return;
  if ((batch.wide >> t & 1u) && first + kPack <= tensor.count) {
    const float4 x = *reinterpret_cast<const float4*>(tensor.source + first);
    const PackOf4<T> y{{from_float<T>(x.x), from_float<T>(x.y), from_float<T>(x.z), from_float<T>(x.w)}};
    *reinterpret_cast<PackOf4<T>*>(tensor.target + first) = y;
    return;
  }
  const std::int64_t end = first + kPack < tensor.count ? first + kPack : tensor.count;
  for (std::int64_t i = first; i < end; ++i) tensor.target[i] = from_float<T>(tensor.source[i]);
}

}  // namespace

template <typename T>
void launch_cast_params(const std::vector<CastTensor<T>>& tensors, cudaStream_t stream) {
  for (std::size_t begin = 0; begin < tensors.size(); begin += kCastTensorsPerLaunch) {
    CastBatch<T> batch;
    int blocks = 0;
    const std::size_t end = std::min(tensors.size(), begin + kCastTensorsPerLaunch);
    for (std::size_t i = begin; i < end; ++i) {
      batch.tensors[batch.size] = tensors[i];
      batch.first_block[batch.size] = blocks;
      if (aligned_to(tensors[i].source, 16) && aligned_to(tensors[i].target, 8)) batch.wide |= 1u << batch.size;
      blocks += static_cast<int>((tensors[i].count + kPackBlockElements - 1) / kPackBlockElements);
      ++batch.size;
    }
    batch.first_block[batch.size] = blocks;
    if (blocks == 0) continue;
    cast_params_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(batch);
    SG_LAUNCH_CHECK("cast_params_kernel");
  }
}

template void launch_cast_params<__half>(const std::vector<CastTensor<__half>>&, cudaStream_t);
template void launch_cast_params<__nv_bfloat16>(const std::vector<CastTensor<__nv_bfloat16>>&, cudaStream_t);

}  // namespace sg::cuda
