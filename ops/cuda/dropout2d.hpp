#pragma once
// PyTorch's Dropout2d on the GPU: channel c of example n of x [N, C, plane]
// (or [N, plane, C] channels-last) is kept, scaled by 1 / (1 - p), when
// Philox keeps "element" n*C + c at the step read from the device step
// counter, else zeroed whole (ops/philox.hpp; the CPU reference
// ref::dropout2d draws the same bits). The backward is the same launch on dY.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/dropout.hpp"

namespace sg::cuda {

struct Dropout2dShape {
  std::int64_t examples = 0, channels = 0, plane = 0;  // N, C and H*W
  bool channels_last = false;                           // [N, H*W, C] rather than [N, C, H*W]
};

template <typename T>
void launch_dropout2d(const T* x, const std::int32_t* step, const Dropout2dShape& shape, const DropoutParams& params,
                      T* y, cudaStream_t stream);

}  // namespace sg::cuda
