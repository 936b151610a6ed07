#pragma once
// What the one-pass dgrad + SGD lowerings (one_pass_strips, one_pass_row_ranges,
// one_pass_wgmma) share: the pattern they take and how they record it. For a
// layer's weight W[N,K] (fp16 parameter, plain SGD), the dgrad of its output
// gradient dY through the activation X = act(Z) before it, dX = act'(dY W)
// (for ReLU masked by X > 0; other activations: a dgrad_dgelu group or a lone
// matmul + activation backward, activation_nodes.hpp),
// and W's update from dY^T X run in ONE pass over W (ops/cuda/fast_paths/one_pass_backward/dgrad_wgrad.hpp).
// The launch also takes the plain bias update that sums dX (the previous
// layer's) and, where the kernel allows, the first layer's weight update,
// which reads dX and the network input.
#include "ops/cuda/fast_paths/one_pass_backward/dgrad_wgrad.hpp"
#include "runtime/cuda/lowerings/activation_nodes.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"

namespace sg::cuda {

struct OnePassNodes {
  NodeId dgrad = -1, activation_backward = -1, weight_sgd = -1;
  Activation activation = Activation::relu;
  ValueId x = -1;                            // the layer's input X (the activation's output)
  NodeId bias_sgd = -1;                      // the previous layer's bias update, when taken
  NodeId input_wgrad = -1, input_sgd = -1;   // the first layer's weight update, when taken
};

// The lowering named `name` that takes the pattern where `kernel` runs its
// sizes (the variants differ in nothing else). `input_update`: whether it
// also looks for the first layer's update; `asks_device`: whether the
// kernel's size check asks the GPU.
std::unique_ptr<CudaLowering> make_one_pass_lowering(std::string_view name, OnePassKernel kernel, bool input_update,
                                                     bool asks_device);

}  // namespace sg::cuda
