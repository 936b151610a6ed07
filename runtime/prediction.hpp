#pragma once
// Batched inference for `stepgraph predict` (issue 23): a prediction graph
// (models/mlp.hpp's build_mlp_predict: the feature table as a graph input,
// the batch fetched inside the graph, the layers, one output) run over every
// batch of a table, on the CPU reference backend or on the GPU
// (runtime/cuda/cuda_prediction.hpp) with the training lowerings.
#include <cstdint>
#include <vector>

#include "graph/graph.hpp"
#include "runtime/data/idx_reader.hpp"
#include "runtime/io/checkpoint.hpp"

namespace sg {

struct PredictionProgram {
  Graph graph;
  ValueId features = -1;  // input [rows, D] of the table's dtype; rows a multiple of batch
  ValueId perm = -1;      // input i32 [rows] (the identity: rows in order)
  ValueId step = -1;      // state i32 [1]: the batch counter the graph advances
  ValueId output = -1;    // the graph's output [batch, K]
  std::int64_t batch = 0;
};

// Throws std::invalid_argument when the program's bindings do not fit
// `table` (rows, features, dtype) or `params` lacks one of its parameters.
void check_prediction_program(const PredictionProgram& p, const data::ImageSet& table,
                              const std::vector<io::TensorBlob>& params);

// The outputs of every row of `table`, row-major [table.count, K] f32, on the
// CPU reference backend; `params` by parameter name (any floating dtype).
std::vector<float> predict_on_cpu(const PredictionProgram& p, const std::vector<io::TensorBlob>& params,
                                  const data::ImageSet& table);

}  // namespace sg
