#pragma once
// The output layer's whole backward and SGD update in one launch, for a small
// batch and few classes. From the logits [B,C], the labels, the layer's input
// h [B,H] (an activation's output: h = act(z)), its weight W [C,H] and bias
// b_out [C], and the bias b_h [H] of the layer that produced h:
//   loss, dlogits = softmax cross-entropy (mean over rows; dlogits in fp16)
//   dh    = act'(dlogits W)                    rounded to fp16; for ReLU
//           (dlogits W) * (h > 0), for tanh/sigmoid from h, for gelu,
//           gelu_tanh and silu from the pre-activation z (activation.hpp)
//   W     = (1 - lr*wd) W - lr dlogits^T h      rounded to fp16
//   b_out, b_h: SGD steps with the column sums of dlogits and of dh
//   step += 1                                   (optional)
// It replaces five launches (softmax-xent, b_out's update, the dgrad, W's
// update, b_h's update) and computes every value with the same expressions
// and in the same order as they do (sgd_step.cuh, softmax_row.cuh), except
// the loss, which is only reported: its rows are added as a warp tree.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "ops/cuda/activation.hpp"
#include "ops/cuda/kernels.hpp"

namespace sg::cuda {

struct OutputLayerBackward {
  const __half* logits = nullptr;       // [batch, classes]
  const std::int32_t* labels = nullptr;  // [batch]
  const __half* h = nullptr;            // [batch, hidden]
  __half* w = nullptr;                  // [classes, hidden], updated in place
  __half* out_bias = nullptr;           // [classes], updated in place
  __half* hidden_bias = nullptr;        // [hidden], updated in place
  __half* dh = nullptr;                 // [batch, hidden] out
  float* loss = nullptr;                // [1] out
  __half* dlogits = nullptr;            // [batch, classes] out, or null when nobody else reads it
  std::int32_t* step = nullptr;         // advanced by one, or null
  const UpdateScalars* w_sgd = nullptr;
  const UpdateScalars* out_bias_sgd = nullptr;
  const UpdateScalars* hidden_bias_sgd = nullptr;
  std::int64_t batch = 0, classes = 0, hidden = 0;
};

// The activation that produced h (a separate argument: the kernel's
// parameter block, and so the ReLU instance's code, stays as it was).
struct OutputLayerActivation {
  Activation activation = Activation::relu;
  const __half* pre_activation = nullptr;  // [batch, hidden] z, for gelu, gelu_tanh and silu (else unused)
};

// Empty when the kernel takes these sizes, else why not.
std::string output_layer_backward_unsupported(std::int64_t batch, std::int64_t classes, std::int64_t hidden);

// `dependent`: as a dependent launch of the stream's previous kernel (dependent_launch.cuh).
void launch_output_layer_backward(const OutputLayerBackward& args, cudaStream_t stream, bool dependent,
                                  const OutputLayerActivation& activation = {});

}  // namespace sg::cuda
