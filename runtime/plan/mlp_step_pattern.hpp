#pragma once
// Recognises a fused graph that is exactly the training step of an MLP
// (batch fetch, Linear+activation layers, softmax cross-entropy, its
// autodiff backward, one optimizer update per parameter, step advance), so a backend may run it as one
// whole-step kernel. The activation is one of relu, gelu, gelu_tanh, silu,
// tanh and sigmoid, the same in every hidden layer: inside the layer's
// linear_forward group (relu, gelu_tanh) or a lone node after a bias-only
// group (the others), its backward in a dgrad_drelu / dgrad_dgelu group or
// a lone node after a lone dgrad matmul. Recognition is structural:
// starting from the batch fetch, each layer's forward, backward and updates
// are looked up by what they read, each group of them must be one fusion
// group of the expected kind, and the graph must hold no other node and no
// other output.
#include <cstdint>
#include <optional>
#include <vector>

#include "graph/graph.hpp"

namespace sg {

// Per layer (input side first): its parameters, their optimizer's update
// nodes (sgd_update or an update rule's op), the
// value the layer outputs (the activation's output, or the logits for the
// last layer) and, for hidden layers, its pre-activation (the bias_add's
// output) and that pre-activation's gradient.
struct WholeStepLayer {
  ValueId weight = -1, bias = -1;
  NodeId weight_update = -1, bias_update = -1;
  ValueId output = -1;
  ValueId pre_activation = -1;       // -1 for the logits layer
  ValueId pre_activation_grad = -1;  // -1 for the logits layer
};

struct WholeStepPlan {
  std::vector<std::int64_t> dims;  // input width, hidden widths, classes
  std::int64_t batch = 0;
  double input_scale = 1, input_shift = 0;
  ValueId images = -1, labels = -1, perm = -1, step = -1, loss = -1;
  std::vector<WholeStepLayer> layers;
  // The hidden layers' activation op (relu when there is no hidden layer),
  // and whether its backward reads the pre-activation (gelu, gelu_tanh,
  // silu) rather than the activation's output (relu, tanh, sigmoid).
  OpKind activation = OpKind::relu;
  bool backward_reads_pre_activation = false;
};

std::optional<WholeStepPlan> match_whole_step(const Graph& graph);

}  // namespace sg
