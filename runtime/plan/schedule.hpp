#pragma once
// Lowers a fused graph into an ordered list of launches: one per fusion group
// (a cuBLASLt matmul with its epilogue, or one of our fused kernels) and one
// per ungrouped node. Backend-neutral: the CUDA program binds each launch to
// a kernel; tests check the order and what each launch reads and writes.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "graph/graph.hpp"

namespace sg {

enum class LaunchKind : std::uint8_t {
  batch_fetch,    // batch_indices + gathers, one kernel
  matmul,         // cuBLASLt, possibly with epilogue or accumulating into a param/velocity
  xent,           // softmax_xent [+ its backward], one kernel
  bias_grad_sgd,  // reduce_rows [+ cast] + sgd_update, one kernel, no gradient buffer
  dgrad_wgrad_sgd,  // one layer's dgrad (masked by its input's ReLU) and its weight's fused SGD, one pass over W
  single,         // one ungrouped element-wise node
  output_layer_backward,  // softmax-xent and the output layer's dgrad, weight/bias updates, the previous bias update
  whole_step,     // every node of an MLP training step, one kernel (see WholeStepPlan)
};

enum class MatmulEpilogue : std::uint8_t { none, bias, relu_bias, relu_aux_bias, drelu };
// Where a matmul's result goes: its output value, or (fused SGD) straight
// into the parameter (D = W - lr*G) or into the velocity (D = momentum*V + G).
enum class MatmulTarget : std::uint8_t { output, param_sgd, velocity_sgd };

std::string_view launch_kind_name(LaunchKind kind);
std::string_view epilogue_name(MatmulEpilogue epilogue);

// ReLU masks written by one matmul epilogue and read by a later one.
struct AuxBuffer {
  std::int64_t rows = 0, cols = 0;  // shape of the row-major output it masks
};

// What a whole-step kernel needs to know of the graph it replaces: per layer
// (input side first) its parameters, their sgd_update nodes, the value the
// layer outputs (ReLU output, or the logits for the last layer) and, for
// hidden layers, the gradient of its pre-activation.
struct WholeStepLayer {
  ValueId weight = -1, bias = -1;
  NodeId weight_sgd = -1, bias_sgd = -1;
  ValueId output = -1;
  ValueId pre_activation_grad = -1;  // -1 for the logits layer
};
struct WholeStepPlan {
  std::vector<std::int64_t> dims;  // input width, hidden widths, classes
  std::int64_t batch = 0;
  double input_scale = 1, input_shift = 0;
  ValueId images = -1, labels = -1, perm = -1, step = -1, loss = -1;
  std::vector<WholeStepLayer> layers;
};

struct Launch {
  LaunchKind kind = LaunchKind::single;
  std::vector<NodeId> nodes;  // graph nodes implemented, in graph order
  int fusion_group = -1;
  std::vector<ValueId> reads;   // values read from outside the launch
  std::vector<ValueId> writes;  // values produced for use outside the launch
  std::vector<ValueId> updates; // graph-owned values updated in place
  // matmul launches
  NodeId matmul_node = -1;
  MatmulEpilogue epilogue = MatmulEpilogue::none;
  MatmulTarget target = MatmulTarget::output;
  ValueId bias = -1;       // epilogue bias value
  ValueId output = -1;     // D when target == output
  NodeId sgd_node = -1;    // the sgd_update (fused SGD targets, bias_grad_sgd)
  NodeId bias_sgd_node = -1;   // dgrad_wgrad_sgd: the previous layer's bias update it also does
  NodeId advance_node = -1;    // bias_grad_sgd, output_layer_backward: the step advance it also does
  // output_layer_backward: nodes = softmax_xent, its backward, then the merged
  // launches' nodes; matmul_node = the dgrad, sgd_node = the weight's update,
  // bias_sgd_node = the hidden layer's bias update, and:
  NodeId output_bias_sgd_node = -1;
  int aux_write = -1, aux_read = -1;  // index into Schedule::aux
  // matmul launches with the batch fetch folded in: its nodes come first in
  // `nodes`, and the kernel gathers the batch itself (and writes it out).
  bool fetches_batch = false;
  // dgrad_wgrad_sgd: the first layer's fused-SGD weight-gradient matmul and
  // its sgd_update, done by the same launch from the dX it computes.
  NodeId input_wgrad_node = -1, input_sgd_node = -1;
  // drelu and dgrad_wgrad_sgd launches whose mask is the sign of the ReLU
  // output they read (dgrad_wgrad_sgd: always). drelu launches whose inner dimension is tiny (the classifier layer's
  // dgrad, <= kSmallInnerDim terms): they mask by the ReLU output's sign
  // (read as a value) instead of a cuBLASLt aux mask, so a small kernel can
  // run them.
  bool mask_from_relu_output = false;
  // whole_step launches
  std::shared_ptr<const WholeStepPlan> whole_step;
  std::vector<ValueId> scratch;  // intermediates the kernel keeps in device memory between its phases
};

inline constexpr std::int64_t kSmallInnerDim = 32;

struct Schedule {
  std::vector<Launch> launches;
  std::vector<AuxBuffer> aux;
};

// Backend choices the lowering asks about.
struct ScheduleOptions {
  // May the dgrad matmul (node `dgrad`, with its relu_backward) and the
  // fused-SGD weight-gradient matmul (node `wgrad`) of the same weight run
  // as one dgrad_wgrad_sgd launch? Unset: never.
  std::function<bool(const Graph&, NodeId dgrad, NodeId wgrad)> merge_dgrad_wgrad;
  // With merge_dgrad_wgrad: may a merged launch also take the bias-gradient
  // SGD launch that follows it and sums its output?
  bool merge_bias_into_dgrad_wgrad = false;
  // May softmax-xent and the launches that follow it for the output layer
  // (its bias update, its dgrad masked by the ReLU output, its weight's fused
  // SGD, the previous layer's bias update) run as one output_layer_backward
  // launch? Asked with the xent launch's backward node and the dgrad matmul.
  // Unset: never.
  std::function<bool(const Graph&, NodeId xent_backward, NodeId dgrad)> merge_output_layer_backward;
  // May the batch fetch run inside the launch of the forward matmul right
  // after it that reads the fetched images? Asked with that matmul node.
  // Unset: never.
  std::function<bool(const Graph&, NodeId matmul)> fold_fetch_into_forward;
  // May a dgrad_wgrad_sgd launch also take the plain-SGD weight-gradient
  // matmul launch right after it that reads its dX (the first layer's
  // update)? Asked with the launch's dgrad node and that matmul node.
  // Unset: never.
  std::function<bool(const Graph&, NodeId dgrad, NodeId input_wgrad)> merge_input_update;
  // May the step counter's advance ride on the last bias-gradient launch
  // (after the batch fetch, the only reader of the counter)?
  bool fold_step_advance = false;
};

// Throws GraphError for patterns no backend kernel exists for (a lone
// batch_indices or gather_rows: the CUDA backend fetches batches fused).
Schedule build_schedule(const Graph& graph, const ScheduleOptions& options = {});

// One whole_step launch for every node of `graph`, which the plan describes
// (see match_whole_step in whole_step_match.hpp).
Schedule build_whole_step_schedule(const Graph& graph, const WholeStepPlan& plan);

// Replays the schedule and throws GraphError if a launch reads a value before
// it is written or after it was updated in place.
void check_schedule_order(const Graph& graph, const Schedule& schedule);

// One line per launch (for `inspect --format schedule`).
std::string dump_schedule(const Graph& graph, const Schedule& schedule);

}  // namespace sg
