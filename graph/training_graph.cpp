#include "graph/training_graph.hpp"

#include "graph/verifier.hpp"

namespace sg {

TrainingGraphStages build_training_stages(const MlpSpec& mlp, const SgdSpec& sgd, const FusionOptions& fusion) {
  TrainingGraphStages s;
  s.forward = build_mlp_forward(mlp);
  verify_graph(s.forward);
  s.backward = s.forward;
  const auto grads = append_backward(s.backward, s.backward.value_named(names::loss));
  verify_graph(s.backward);
  s.optimized = s.backward;
  append_sgd(s.optimized, grads, sgd);
  verify_graph(s.optimized);
  s.fused = s.optimized;
  fuse(s.fused, fusion);
  verify_graph(s.fused);
  return s;
}

}  // namespace sg
