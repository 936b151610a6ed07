#pragma once
// Inverted dropout on the GPU: y[i] = x[i] * scale where Philox keeps element
// i at the step read from the device step counter, else 0 (ops/philox.hpp;
// the CPU reference ref::dropout draws the same bits). The backward is the
// same launch on dY.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace sg::cuda {

struct DropoutParams {
  std::uint64_t seed = 0;
  std::int64_t stream = 0;     // the dropout site (DropoutAttrs::stream)
  std::uint32_t threshold = 0;  // philox::dropout_threshold(p)
  float scale = 1.f;            // 1 / (1 - p)
};

template <typename T>
void launch_dropout(const T* x, const std::int32_t* step, std::int64_t n, const DropoutParams& params, T* y,
                    cudaStream_t stream);

}  // namespace sg::cuda
