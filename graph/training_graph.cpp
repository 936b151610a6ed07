#include "graph/training_graph.hpp"

#include "graph/verifier.hpp"

namespace sg {

TrainingGraphStages build_training_stages(Graph forward, ValueId loss, const OptimizerSpec& sgd,
                                          const FusionOptions& fusion, std::optional<ValueId> step) {
  TrainingGraphStages s;
  s.forward = std::move(forward);
  verify_graph(s.forward);
  s.backward = s.forward;
  const auto grads = append_backward(s.backward, loss);
  verify_graph(s.backward);
  s.optimized = s.backward;
  append_optimizer(s.optimized, grads, sgd, step);
  if (step) s.optimized.advance_step(*step);
  verify_graph(s.optimized);
  s.fused = s.optimized;
  fuse(s.fused, fusion);
  verify_graph(s.fused);
  return s;
}

}  // namespace sg
