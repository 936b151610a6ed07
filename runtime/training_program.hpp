#pragma once
// What a trainer receives, whatever built it (models/ for the MLP): the fused
// training-step graph and the eval graph, the initial parameter values by
// name, which values of each graph hold the data and the results, and the
// initial learning rate. The runtime knows no model and no value names: it
// binds the dataset, the permutation, the step counter and the results
// through DataBindings, and parameters and optimizer state by graph role.
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "graph/graph.hpp"

namespace sg {

// The values of one graph the runtime binds to host data or reads back.
struct DataBindings {
  ValueId images = -1;  // input u8/f16/f32 [rows, features]: the split's whole feature table
  ValueId labels = -1;  // label u8 [rows]: its class labels, or f32 [rows, K]: its float targets
  ValueId perm = -1;    // input i32 [rows]: row order (the epoch permutation; identity for eval)
  ValueId step = -1;    // state i32 [1]: the counter the batch fetch reads; the graph advances it
  ValueId loss = -1;    // output f32: mean loss of the batch
  std::optional<ValueId> correct;  // output i32: correct predictions of the batch (a classifier's eval)
  std::int64_t batch = 0;          // rows one run of the graph consumes
  // Data parallel (issue 25): the ranks that share each global batch of
  // ranks * batch rows (the epoch has rows / (ranks * batch) steps).
  std::int64_t ranks = 1;
};

// Initial values of one parameter of the training graph (f32; converted to
// the parameter's dtype when uploaded).
struct ParameterInit {
  std::string name;
  Shape shape;
  std::vector<float> values;
};

// The training and eval steps again with channels-last convolution layers
// (graph/channels_last_pass.hpp): same parameters, state and value names,
// other value ids and activation layouts. A backend runs one of the two.
struct ChannelsLastVariant {
  Graph train;
  DataBindings train_data;
  Graph eval;
  DataBindings eval_data;
  // Conversions back to channels-first for a reader other than a flatten or
  // the global pooling, in the training forward (an avg_pool2d, a dropout2d,
  // ...): each a transpose in the forward and one in the backward.
  int inner_exits = 0;
  int batch_norms = 0;  // batch_norm layers turned channels-last (the rows path's [N*H*W, C])
};

struct TrainingProgram {
  Graph train;               // one fused training step: updates params and state in place
  DataBindings train_data;   // over the training split's rows
  // Loss and correct count of one batch. Its parameters are `train`'s
  // parameters or state values of the same name (batch norm's running
  // statistics, which the training step updates and evaluation reads).
  Graph eval;
  DataBindings eval_data;    // over the test split's rows; `correct` set; batch divides those rows
  // Every parameter of `train`, and state values that do not start at zero
  // (a running variance starts at one); other values start at zero.
  std::vector<ParameterInit> init;
  double learning_rate = 0.01;      // initial lr of the optimizer updates (run state, not IR)
  // Set by the model builders for the CUDA target where the model has a
  // convolution; the CUDA backend picks it by backend.activation_layout
  // (runtime/cuda/activation_layout_choice.hpp).
  std::optional<ChannelsLastVariant> channels_last;
};

// Throws std::invalid_argument naming the problem when the program does not
// fit the data (image/label/perm shapes against the split rows) or is
// inconsistent: bindings out of range or of the wrong role/dtype/shape, an
// eval parameter missing from the training graph, an initialiser that names
// no parameter or has the wrong shape, a parameter without an initialiser, a
// parameter or state value other than the step counter named like the
// checkpoint's step entry (kStepEntry, runtime/tensor_blob.hpp).
void check_training_program(const TrainingProgram& program, std::int64_t train_rows, std::int64_t test_rows);

// The training graph's state values that the eval graph reads (as parameters
// of the same name) or `init` gives values: a backend keeps them with the
// parameters rather than with the training step's own state.
std::set<std::string> shared_state_names(const TrainingProgram& program);

}  // namespace sg
