#pragma once
// Appends the optimizer: one sgd_update per parameter, placed as early as it
// is legal (after its gradient is produced and after the last read of the
// parameter) so gradients die young. The step advance is the pipeline's
// (graph/training_graph.hpp): the optimizer knows no step counter.
#include "graph/autodiff.hpp"

namespace sg {

struct SgdSpec {
  // The initial learning rate, for trainers (CpuExecutor::set_learning_rate,
  // the CUDA program's scalar table): the graph does not hold it.
  double lr = 0.01;
  double momentum = 0.0;      // > 0 adds a velocity state per parameter ("vel_<param>")
  double weight_decay = 0.0;
};

void append_sgd(Graph& graph, const GradientMap& grads, const SgdSpec& sgd);

}  // namespace sg
