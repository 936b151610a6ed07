#pragma once
// Every fp32 parameter's low-precision working copy in one launch: a step
// that keeps fp32 master weights casts each parameter before its forward,
// and one launch for all of them costs one graph node instead of one per
// tensor (a CNN has eight).
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace sg::cuda {

template <typename T>
struct CastTensor {
  const float* source = nullptr;
  T* target = nullptr;
  std::int64_t count = 0;
};

// T is __half or __nv_bfloat16. Any number of tensors (launched in groups
// of up to kCastTensorsPerLaunch when there are more).
template <typename T>
void launch_cast_params(const std::vector<CastTensor<T>>& tensors, cudaStream_t stream);

constexpr int kCastTensorsPerLaunch = 32;

}  // namespace sg::cuda
