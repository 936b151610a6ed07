#pragma once
// Builds the forward graph of an MLP (Linear -> ReLU -> ... -> Linear) with
// the batch fetch inside the graph: the whole dataset is a graph input, a
// device-side step counter and a permutation select each batch.
#include <cstdint>
#include <string>
#include <vector>

#include "graph/graph.hpp"

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

// Value names shared by every graph built here, so backends can bind buffers
// (and the eval graph can share the training graph's parameters) by name.
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
// Eval graph: the same forward plus count_correct; outputs: loss, correct.
Graph build_mlp_eval(const MlpSpec& spec);

}  // namespace sg
