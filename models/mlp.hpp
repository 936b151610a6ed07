#pragma once
// The MLP model builder (Linear -> ReLU -> ... -> Linear, softmax
// cross-entropy) with the batch fetch inside the graph: the whole dataset is a
// graph input, a device-side step counter and a permutation select each batch.
// Owns the MLP's value names, its initial parameter values and the
// TrainingProgram the runtime receives (models/mlp_program.hpp).
#include <cstdint>
#include <string>
#include <vector>

#include "graph/fusion_pass.hpp"
#include "graph/graph.hpp"
#include "graph/optimizer_pass.hpp"
#include "graph/training_graph.hpp"
#include "runtime/training_program.hpp"

namespace sg {

struct MlpSpec {
  std::vector<std::int64_t> layers;  // [784, 128, 128, 128, 10]: input first, classes last
  std::int64_t batch = 32;
  std::int64_t dataset_rows = 60000;  // rows of the image table the batches come from
  DType weight_dtype = DType::f16;    // storage of parameters (f32 = master weights)
  DType compute_dtype = DType::f16;   // activations and matmul inputs
  double input_scale = 1.0 / 255.0;   // x = pixel * scale + shift
  double input_shift = 0.0;
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
}  // namespace names

// Throws GraphError when the spec is unusable (fewer than 2 sizes, batch
// larger than the dataset, ...).
void validate_mlp_spec(const MlpSpec& spec);

// Forward graph: batch fetch, layers, softmax cross-entropy; output: loss.
Graph build_mlp_forward(const MlpSpec& spec);
// Eval graph: the same forward plus count_correct; outputs: loss, correct;
// advances the step counter at its end.
Graph build_mlp_eval(const MlpSpec& spec);
// The MLP's forward graph through graph/training_graph.hpp's pipeline
// (autodiff, SGD, step advance, fusion).
TrainingGraphStages build_training_stages(const MlpSpec& spec, const SgdSpec& sgd, const FusionOptions& fusion = {});

// The runtime-facing bindings of a graph built here (by the names above);
// `correct` only where the graph has it.
DataBindings mlp_data_bindings(const Graph& graph, std::int64_t batch);

// Initial values of w1, b1, w2, b2, ... (PyTorch nn.Linear's scheme from the
// project's counter-based RNG, models/param_init.hpp, so bench/ scripts
// reproduce them): layer l (1-based) draws w<l> with parameter index 2(l-1),
// b<l> with 2(l-1)+1, both with fan_in = layers[l-1].
std::vector<ParameterInit> mlp_initial_parameters(const std::vector<std::int64_t>& layers, std::uint64_t seed);

}  // namespace sg
