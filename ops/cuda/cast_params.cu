// One launch casting several fp32 tensors: the tensors' blocks are laid end
// to end over the grid, and each block finds its tensor by the prefix of
// block counts held in the kernel's parameter (no device-side table).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "ops/cuda/cast_params.hpp"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/launch_config.cuh"

namespace sg::cuda {
namespace {

template <typename T>
struct CastBatch {
  CastTensor<T> tensors[kCastTensorsPerLaunch];
  int first_block[kCastTensorsPerLaunch + 1];  // block index where tensor i starts
  int size = 0;
};

template <typename T>
__global__ void __launch_bounds__(kThreads) cast_params_kernel(const CastBatch<T> batch) {
  int t = 0;
  while (t + 1 < batch.size && static_cast<int>(blockIdx.x) >= batch.first_block[t + 1]) ++t;
  const CastTensor<T>& tensor = batch.tensors[t];
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x - batch.first_block[t]) * kThreads + threadIdx.x;
  if (i < tensor.count) tensor.target[i] = from_float<T>(tensor.source[i]);
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
      blocks += static_cast<int>((tensors[i].count + kThreads - 1) / kThreads);
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
