#pragma once
// Several tensors (f32, f16 or bf16) copied and multiplied by one constant
// (dst = src * factor; in place when src == dst), in ONE launch: each block
// owns a chunk of one tensor. The all-reduce of a data-parallel bucket runs
// NCCL's symmetric kernels on one contiguous staging buffer: a launch with
// factor 1 gathers the bucket's gradients into it, and after NCCL's sum
// another scatters the sums times 1/N into the reduced gradients (an exact
// halving for two ranks: ncclAvg's bits; runtime/cuda/lowerings/nccl_all_reduce.cpp).
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "ops/cuda/cuda_resources.hpp"

namespace sg::cuda {

enum class ScaledType : std::int32_t { f32, f16, bf16 };

struct ScaledTensor {
  const void* src;
  void* dst;
  std::int64_t n;
  ScaledType type;
};

class ScaleMultiTensor {
 public:
  ScaleMultiTensor(const std::vector<ScaledTensor>& tensors, float factor);
  void launch(cudaStream_t stream) const;
  int blocks() const { return blocks_; }

 private:
  DeviceBuffer table_;  // entries with their first block
  int count_ = 0, blocks_ = 0;
  float factor_ = 1.f;
};

}  // namespace sg::cuda
