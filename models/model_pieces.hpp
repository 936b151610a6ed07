#pragma once
// Graph pieces every model builder here shares (models/mlp.cpp and
// models/sequential.cpp): the in-graph batch fetch, a parameter cast to the
// compute dtype, the activation layers and the losses. One copy, so the MLP
// and the Sequential form of the same network build the same nodes.
#include <cstdint>

#include "graph/graph.hpp"
#include "models/mlp.hpp"

namespace sg::model_pieces {

// Where a batch comes from: the dataset tables (graph inputs named by
// sg::names), the rows per step and how features become compute values.
struct BatchSource {
  std::int64_t dataset_rows = 0;
  std::int64_t features = 0;      // columns of the feature table
  DType feature_dtype = DType::u8;
  std::int64_t target_width = 0;  // 0: u8 class labels; K > 0: f32 [rows, K] targets
  std::int64_t batch = 0;
  DType compute_dtype = DType::f16;
  double input_scale = 1.0;
  double input_shift = 0.0;
  std::int64_t rank = 0;   // data parallel: this rank's slice of each global batch of ranks * batch rows
  std::int64_t ranks = 1;
};
BatchSource batch_source(const MlpSpec& spec);

struct FetchedBatch {
  ValueId x, y;  // x: [batch, features] in the compute dtype; y: labels (i32) or targets (f32)
};
// images, labels, perm, step, batch_indices, then the two gathers.
FetchedBatch add_batch_fetch(Graph& g, const BatchSource& source);
// The features only (prediction graphs): images, perm, step, batch_indices, gather.
ValueId add_feature_fetch(Graph& g, const BatchSource& source);

// A parameter as the matmuls see it: cast to the compute dtype when the
// stored (master) dtype differs.
ValueId as_compute(Graph& g, ValueId param, DType compute);
// identity returns `h` itself (no node).
ValueId add_activation(Graph& g, MlpActivation a, ValueId h);
// The loss node (named names::loss) on `out` against `y`.
ValueId add_loss(Graph& g, MlpLoss loss, double label_smoothing, ValueId out, ValueId y);
// The end of an eval graph: the loss and, for classification, the correct
// count as outputs (a regression run reports its test loss only:
// DataBindings.correct unset), then the step advance.
void add_eval_outputs(Graph& g, MlpLoss loss, double label_smoothing, ValueId out, ValueId y);

}  // namespace sg::model_pieces
