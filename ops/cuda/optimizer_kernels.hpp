#pragma once
// Gradient clipping (issue 21): clip_grad_norm_'s factor (the global L2 norm
// of all gradients reduced on the device, no host sync) and the scaling it
// drives. The update rules are elsewhere: SGD (plain, momentum, Nesterov) in
// sgd_multi_tensor.hpp and sgd.cu, Adam and RMSprop in update_rules/ and
// fast_paths/fused_update/. Each implements its twin in
// ops/cpu/reference_ops.hpp; all are asynchronous on `stream`, capturable into
// a CUDA graph, and read the clip scale from device memory, so a graph is
// never re-captured. Element types: float, __half or __nv_bfloat16.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "ops/cuda/cuda_resources.hpp"
#include "ops/cuda/kernels.hpp"

namespace sg::cuda {

// One gradient of a clip-norm launch: n elements of float, __half or bf16.
struct ClipInput {
  const void* data;
  std::int64_t n;
  int type;  // 0 float, 1 __half, 2 __nv_bfloat16
};

// clip_grad_norm_'s factor: *scale = min(1, max_norm / (sqrt(sum of squares of
// every element of every input) + 1e-6)), in one launch: blocks write partial
// sums, the last block to finish adds them in block order (deterministic).
class ClipScale {
 public:
  ClipScale(const std::vector<ClipInput>& inputs, float max_norm);
  void launch(float* scale, cudaStream_t stream) const;

 private:
  DeviceBuffer table_, partials_, finished_;
  int count_ = 0, blocks_ = 0;
  float max_norm_ = 1.f;
};

// y = x * *scale (n elements).
template <typename T>
void launch_scale_grad(const T* x, const float* scale, std::int64_t n, T* y, cudaStream_t stream);

}  // namespace sg::cuda
