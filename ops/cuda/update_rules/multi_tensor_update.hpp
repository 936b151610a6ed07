#pragma once
// One update rule (update_rule.hpp) over many tensors in ONE launch: each
// block owns a chunk of one tensor and makes one pass over it (read w, g and
// the rule's used state slots; write w and the slots). Asynchronous on
// `stream`, capturable into a CUDA graph: the learning rate
// (UpdateScalars::lr), the step counter and the clip scale are read from
// device memory, so a graph is never re-captured. W (parameter) and G
// (gradient): float, __half or __nv_bfloat16; the state slots are float.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "ops/cuda/cuda_resources.hpp"
#include "ops/cuda/gradient_order.hpp"
#include "ops/cuda/kernels.hpp"
#include "ops/cuda/update_rules/update_rule.hpp"

namespace sg::cuda {

// The f16/bf16 copy of an fp32 master weight that the next step's forward
// reads, written from the updated value in the update's own pass: the step
// then casts nothing at its start (the copy costs 2 bytes an element here,
// a cast launch 6). Rounded as the cast op rounds (from_float).
enum class CopyType : std::uint8_t { none, f16, bf16 };
struct ComputeCopy {
  void* data = nullptr;
  CopyType type = CopyType::none;
};

// One tensor of a multi-tensor launch (device pointers).
template <typename W, typename G>
struct UpdateTensor {
  W* w;
  const G* g;
  StateSlots state;  // the rule's slots (Adam: m, v; unused ones null)
  std::int64_t n;
  GradientOrder order{};  // a filter's gradient written [O,KH,KW,C] (ops/cuda/gradient_order.hpp)
  ComputeCopy copy{};     // W float only
};

// `step` is the graph's step counter before its advance (Adam: t = *step + 1;
// a rule without bias correction may get null). With `clip_scale`, the
// gradient is multiplied by *clip_scale first. With `advance_step`, the last
// block to finish increments *advance_step (every block has read the step by
// then), so the step advance needs no launch.
template <class Rule, typename W, typename G>
class MultiTensorUpdate {
 public:
  MultiTensorUpdate(const std::vector<UpdateTensor<W, G>>& tensors, HyperOf<Rule> hyper);
  // `dependent`: a programmatic dependent launch (dependent_launch.cuh) where supported.
  void launch(const UpdateScalars* scalars, const std::int32_t* step, const float* clip_scale,
              std::int32_t* advance_step, cudaStream_t stream, bool dependent = false) const;
  int blocks() const { return blocks_; }

 private:
  DeviceBuffer table_;     // entries with their first block
  DeviceBuffer finished_;  // blocks done this launch (reset by the last one)
  int count_ = 0, blocks_ = 0;
  bool copies_ = false;     // some tensor has a compute copy
  std::int64_t chunk_ = 0;  // elements a block
  HyperOf<Rule> hyper_;
};

}  // namespace sg::cuda
