#pragma once
// PyTorch's Dropout2d on the GPU: plane p (= n*C + c) of x [planes, plane]
// is kept, scaled by 1 / (1 - p), when Philox keeps "element" p at the step
// read from the device step counter, else zeroed whole (ops/philox.hpp; the
// CPU reference ref::dropout2d draws the same bits). The backward is the
// same launch on dY.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/dropout.hpp"

namespace sg::cuda {

template <typename T>
void launch_dropout2d(const T* x, const std::int32_t* step, std::int64_t planes, std::int64_t plane,
                      const DropoutParams& params, T* y, cudaStream_t stream);

}  // namespace sg::cuda
