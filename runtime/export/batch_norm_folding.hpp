#pragma once
// Batch normalisation folded into the layer before it, for inference (issue
// 37): a batch_norm whose one input is a conv2d or linear layer that no other
// layer reads normalises that layer's output channels with constants (the
// running statistics), so the layer can do it: per output channel o, with
// s = gamma[o] / sqrt(running_var[o] + eps),
//   W'[o, ...] = W[o, ...] * s,   b'[o] = (b[o] - running_mean[o]) * s + beta[o],
// and the batch_norm becomes an identity layer. What `stepgraph export
// --fold-batch-norm` writes: one Conv / Gemm where there were two nodes.
#include "runtime/export/exported_graph.hpp"

namespace sg::exporting {

// Folds every batch_norm that can be (computed in double, stored as float);
// returns how many. The others (after a pooling, an add, a layer read twice) stay.
int fold_batch_norms(ExportedGraph& model);

}  // namespace sg::exporting
