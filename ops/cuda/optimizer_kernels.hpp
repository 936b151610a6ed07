#pragma once
// Kernels of the optimizers and gradient clipping beyond plain SGD (issue 21):
// Adam/AdamW over many tensors in one launch, a bias gradient fused with its
// Adam update, Nesterov SGD, and clip_grad_norm_ (the global L2 norm of all
// gradients reduced on the device, no host sync). Each implements its twin in
// ops/cpu/reference_ops.hpp; all are asynchronous on `stream`, capturable into
// a CUDA graph, and read the learning rate (SgdScalars::lr), the step counter
// and the clip scale from device memory, so a graph is never re-captured.
// Element types: W (parameter) and G (gradient) are float, __half or
// __nv_bfloat16; Adam's moments are float.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "ops/cuda/cuda_resources.hpp"
#include "ops/cuda/kernels.hpp"

namespace sg::cuda {

// Constant hyper-parameters of one Adam/AdamW update (graph attributes).
struct AdamHyper {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.f;
  bool decoupled = false;  // AdamW
};

// One tensor of a multi-tensor launch (device pointers).
template <typename W, typename G>
struct AdamTensor {
  W* w;
  const G* g;
  float* m;
  float* v;
  std::int64_t n;
};

// Adam over several tensors in ONE launch: each block owns a chunk of one
// tensor and makes one pass over it (read w, g, m, v; write w, m, v).
// t = *step + 1 (the graph's step counter before its advance). With
// `clip_scale`, the gradient is multiplied by *clip_scale first. With
// `advance_step`, the last block to finish increments *advance_step (every
// block has read the step by then), so the step advance needs no launch.
template <typename W, typename G>
class AdamMultiTensor {
 public:
  AdamMultiTensor(const std::vector<AdamTensor<W, G>>& tensors, AdamHyper hyper);
  // `dependent`: a programmatic dependent launch (dependent_launch.cuh) where supported.
  void launch(const SgdScalars* scalars, const std::int32_t* step, const float* clip_scale,
              std::int32_t* advance_step, cudaStream_t stream, bool dependent = false) const;
  int blocks() const { return blocks_; }

 private:
  DeviceBuffer table_;     // entries with their first block
  DeviceBuffer finished_;  // blocks done this launch (reset by the last one)
  int count_ = 0, blocks_ = 0;
  AdamHyper hyper_;
};

// Bias gradient (column sums of dy [rows, cols], f32 accumulation in a fixed
// order) fused with the Adam update of bias[cols]: no gradient buffer.
template <typename W, typename G>
void launch_bias_grad_adam(const G* dy, std::int64_t rows, std::int64_t cols, W* bias, float* m, float* v,
                           const SgdScalars* scalars, const std::int32_t* step, AdamHyper hyper, cudaStream_t stream,
                           bool dependent = false);

// PyTorch's SGD(nesterov=True) on n elements (velocity in W's type).
template <typename W, typename G>
void launch_sgd_nesterov(W* w, const G* g, W* velocity, std::int64_t n, const SgdScalars* scalars, cudaStream_t stream);

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
