#pragma once
// What the CNN step's translation units call of each other on the host
// (cnn_step.hpp has the public interface): kernel 1's shared-memory layout
// and the gradient workspace's (cnn_step_layout.cu), and kernel 1's launch
// (cnn_step.cu).
#include <cuda_runtime.h>

#include <cstddef>

#include "ops/cuda/fast_paths/cnn_step/cnn_step.hpp"

namespace sg::cuda::cnn_step_parts {

// Kernel 1's shared-memory layout for these sizes (blocks and the gradient
// workspace left to plan_gradients) and the dynamic shared memory it takes.
struct SharedLayout {
  CnnStepLaunch launch;
  std::size_t bytes = 0;
};
SharedLayout shared_layout(const CnnStepArgs& a);

// The gradient workspace (CnnStepLaunch::slice_offset, factor_offset): conv
// tensors in the blocks' slices, in tensor order; with one example per
// block each linear layer's dZ and x in an example's factor row, in layer
// order, else its tensors in the slices too (linear_backward says why).
void plan_gradients(const CnnStepArgs& a, int examples_per_block, CnnStepLaunch& l);

// Kernel 1 on `stream` (cnn_step_update.cu's launch_cnn_step launches it,
// then the update kernel, whose code depends on the optimizer).
void launch_cnn_step_examples(const CnnStepArgs& a, const CnnStepLaunch& l, cudaStream_t stream);

}  // namespace sg::cuda::cnn_step_parts
