#pragma once
// The MLP model builder (Linear -> activation [-> dropout] -> ... -> Linear,
// then softmax cross-entropy [label-smoothed] or an mse/l1 regression loss;
// ReLU and softmax cross-entropy by default) with the batch fetch inside the
// graph: the whole dataset is a graph input, a device-side step counter and
// a permutation select each batch.
// Owns the MLP's value names, its initial parameter values and the
// TrainingProgram the runtime receives (models/mlp_program.hpp).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "graph/fusion_pass.hpp"
#include "graph/graph.hpp"
#include "graph/optimizer_pass.hpp"
#include "graph/training_graph.hpp"
#include "runtime/training_program.hpp"

namespace sg {

// The activation between hidden layers (identity: none) and the loss
// (mse and l1 regress float targets; softmax_xent classifies).
enum class MlpActivation : std::uint8_t { relu, gelu, gelu_tanh, silu, tanh, sigmoid, identity };
enum class MlpLoss : std::uint8_t { softmax_xent, mse, l1 };
std::string_view activation_name(MlpActivation a);
std::string_view loss_name(MlpLoss l);
// Throw std::invalid_argument for an unknown name.
MlpActivation activation_from_name(std::string_view name);
MlpLoss loss_from_name(std::string_view name);
inline bool is_regression(MlpLoss l) { return l != MlpLoss::softmax_xent; }

struct MlpSpec {
  std::vector<std::int64_t> layers;  // [784, 128, 128, 128, 10]: input first, classes last
  std::int64_t batch = 32;
  std::int64_t dataset_rows = 60000;  // rows of the image table the batches come from
  DType weight_dtype = DType::f16;    // storage of parameters (f32 = master weights)
  DType compute_dtype = DType::f16;   // activations and matmul inputs
  double input_scale = 1.0 / 255.0;   // x = pixel * scale + shift
  double input_shift = 0.0;
  // issue 23 (own data): the dataset's feature table dtype (u8 images, f16 or
  // f32 features; the gather scales any of them into the compute dtype), and
  // the targets: 0 = integer class labels u8 [rows]; K > 0 = float targets
  // f32 [rows, K], gathered per batch into f32 [batch, K] (regression losses).
  DType feature_dtype = DType::u8;
  std::int64_t target_width = 0;
  // issue 21 (activations, losses, dropout): between hidden layers, the
  // activation, then (training graph only) inverted dropout with probability
  // `dropout` keyed on `dropout_seed`; the loss on the last layer's output.
  MlpActivation activation = MlpActivation::relu;
  MlpLoss loss = MlpLoss::softmax_xent;
  double label_smoothing = 0.0;  // softmax_xent only, PyTorch's CrossEntropyLoss(label_smoothing)
  double dropout = 0.0;          // in [0, 1)
  std::uint64_t dropout_seed = 0;
  // issue 25 (data parallel): this graph fetches rank `batch_rank`'s `batch`
  // rows of every global batch of batch_ranks * batch rows.
  std::int64_t batch_rank = 0;
  std::int64_t batch_ranks = 1;
};

// Value names shared by every graph built here, so the eval graph shares the
// training graph's parameters (and checkpoints their entries) by name. Only
// this builder and its tests spell them: the runtime gets DataBindings.
namespace names {
inline constexpr const char* images = "images";
inline constexpr const char* labels = "labels";
inline constexpr const char* perm = "perm";
inline constexpr const char* step = "step";
inline constexpr const char* loss = "loss";
inline constexpr const char* correct = "correct";
std::string weight(std::size_t layer);  // "w1" (1-based)
std::string bias(std::size_t layer);    // "b1"
std::string running_mean(std::size_t layer);  // "running_mean1": a batch_norm layer's (models/sequential.hpp)
std::string running_var(std::size_t layer);   // "running_var1"
}  // namespace names

// Throws GraphError when the spec is unusable (fewer than 2 sizes, batch
// larger than the dataset, ...).
void validate_mlp_spec(const MlpSpec& spec);

// Forward graph: batch fetch, layers, softmax cross-entropy; output: loss.
Graph build_mlp_forward(const MlpSpec& spec);
// Eval graph: the same forward (without dropout) plus count_correct (not for
// a regression loss); outputs: loss[, correct]; advances the step counter at
// its end.
Graph build_mlp_eval(const MlpSpec& spec);
// Prediction graph (stepgraph predict, issue 23): the batch fetch of the
// features only (no labels), the layers as in eval (no dropout), and the last
// layer's output [batch, outputs] (class scores, or the regression outputs)
// as the graph's only output; advances the step counter at its end.
Graph build_mlp_predict(const MlpSpec& spec);
// The MLP's forward graph through graph/training_graph.hpp's pipeline
// (autodiff, SGD, step advance, fusion).
TrainingGraphStages build_training_stages(const MlpSpec& spec, const OptimizerSpec& sgd, const FusionOptions& fusion = {});

// The runtime-facing bindings of a graph built here (by the names above);
// `correct` only where the graph has it.
DataBindings mlp_data_bindings(const Graph& graph, std::int64_t batch);

// Initial values of w1, b1, w2, b2, ... (PyTorch nn.Linear's scheme from the
// project's counter-based RNG, models/param_init.hpp, so bench/ scripts
// reproduce them): layer l (1-based) draws w<l> with parameter index 2(l-1),
// b<l> with 2(l-1)+1, both with fan_in = layers[l-1].
std::vector<ParameterInit> mlp_initial_parameters(const std::vector<std::int64_t>& layers, std::uint64_t seed);

}  // namespace sg
