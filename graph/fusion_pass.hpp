#pragma once
// Marks groups of nodes a backend may run as one kernel (or one cuBLASLt call
// with an epilogue). Grouping never changes what the graph computes: the CPU
// backend ignores it, the CUDA scheduler lowers each group at once.
#include "graph/graph.hpp"

namespace sg {

struct FusionOptions {
  bool matmul_epilogues = true;  // linear_forward, dgrad_drelu
  bool fused_sgd = true;         // wgrad_sgd, bgrad_sgd: no gradient buffer
  bool fused_loss = true;        // xent_fused
  bool batch_fetch = true;       // batch_indices + gathers
};

void fuse(Graph& graph, const FusionOptions& options = {});

}  // namespace sg
