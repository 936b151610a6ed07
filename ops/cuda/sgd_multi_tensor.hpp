#pragma once
// SGD (PyTorch's, dampening 0, plain or Nesterov: ops/cuda/sgd_step.cuh) over several tensors in
// ONE launch: each block owns a chunk of one tensor and makes one pass over
// it (read w, the gradient and the velocity; write w and the velocity). Each
// tensor reads its own UpdateScalars (its sgd_update node's learning rate,
// momentum and weight decay), so updates with different hyper-parameters
// share the launch. The gradient is read as G and used in f32: an f16 -> f32
// cast before an fp32 master weight's update is folded in (exact), as in
// the element-wise launch_sgd_update, which gives the same bits.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "ops/cuda/cuda_resources.hpp"
#include "ops/cuda/gradient_order.hpp"
#include "ops/cuda/kernels.hpp"

namespace sg::cuda {

// One tensor of the launch (device pointers; velocity null without momentum).
template <typename W, typename G>
struct SgdTensor {
  W* w;
  const G* g;
  W* velocity;
  std::int64_t n;
  const UpdateScalars* scalars;
  bool nesterov = false;  // PyTorch's SGD(nesterov=True): needs the velocity
  GradientOrder order{};  // a filter's gradient written [O,KH,KW,C] (ops/cuda/gradient_order.hpp)
};

template <typename W, typename G>
class SgdMultiTensor {
 public:
  explicit SgdMultiTensor(const std::vector<SgdTensor<W, G>>& tensors);
  // With `advance_step`, the launch also increments *advance_step once (the
  // step advance riding on it: nothing in this kernel reads the step).
  void launch(cudaStream_t stream, std::int32_t* advance_step = nullptr) const;
  int blocks() const { return blocks_; }

 private:
  DeviceBuffer table_;  // entries with their first block
  int count_ = 0, blocks_ = 0;
};

}  // namespace sg::cuda
