#pragma once
// Recognises a fused graph that is exactly the training step of a small
// sequential CNN (issue 22): the batch fetch, a chain of per-example layers
// (conv2d with bias, max_pool2d, relu or another activation, dropout2d,
// dropout, flatten/reshape, linear), softmax cross-entropy on the last linear layer, the autodiff
// backward of that chain, one optimizer update per parameter (SGD or an
// update rule's op) of its fp32 master copy, and the step advance. A backend may then run the whole step per
// example, each example's activations kept on chip (ops/cuda/fast_paths/cnn_step/cnn_step.hpp).
// A data-parallel rank's step matches too (issue 38): its fetch takes the
// rank's slice, and its fp32 gradients reach their updates through
// all_reduce_mean buckets, which a backend leaves to the update stage.
// Recognition is structural, as mlp_step_pattern's: every backward node is
// looked up by what it reads and must be the one autodiff makes for its
// forward layer, and the graph must hold no other node and no other output,
// so a graph the kernel would compute differently is never taken.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "graph/graph.hpp"

namespace sg {

// relu apart from the other activations: the kernels run it inside a
// pooling or linear layer before it.
enum class CnnStepLayerKind : std::uint8_t { conv2d, max_pool2d, relu, activation, dropout2d, dropout, view, linear };

struct CnnStepLayer {
  CnnStepLayerKind kind = CnnStepLayerKind::view;
  ValueId input = -1, output = -1;  // batch-major values ([B, C, H, W] or [B, F])
  // conv2d and linear: the fp32 master parameters (cast to the compute dtype
  // in the forward) and the optimizer's update nodes that apply their gradients.
  ValueId weight = -1, bias = -1;
  NodeId weight_update = -1, bias_update = -1;
  ValueId weight_gradient = -1, bias_gradient = -1;  // the fp32 gradients (cast) the update, or its all-reduce, reads
  bool input_gradient = false;  // whether the backward computes the gradient of `input`
  Conv2dAttrs conv;             // conv2d
  Pool2dAttrs pool;             // max_pool2d
  DropoutAttrs dropout;         // dropout, dropout2d
  OpKind activation = OpKind::relu;  // activation: its forward op (gelu, gelu_tanh, silu, tanh, sigmoid)
};

struct CnnStepPlan {
  std::int64_t batch = 0;
  double input_scale = 1, input_shift = 0;
  ValueId images = -1, labels = -1, perm = -1, step = -1, loss = -1;
  std::int64_t rank = 0, ranks = 1;  // the fetch's slice of the global batch (data parallel)
  // Every gradient is reduced over the ranks (all_reduce_mean) between its
  // cast and its update; none is when false.
  bool gradients_reduced = false;
  // The loss backward's LossGradientAttrs::scale (1/ranks in a rank whose
  // gradients are pre-scaled, issue 38; else 1).
  double gradient_scale = 1.0;
  ValueId logits = -1;
  std::vector<CnnStepLayer> layers;  // input side first; the last is the linear layer giving the logits
};

// The plan, or why the graph is not such a step (for logs and dumps).
struct CnnStepMatch {
  std::optional<CnnStepPlan> plan;
  std::string why_not;
};
CnnStepMatch match_cnn_step(const Graph& graph);

}  // namespace sg
