#pragma once
// The generic pipeline from a forward graph to the training-step graph,
// keeping every stage so it can be inspected: forward -> autodiff ->
// optimizer -> fusion. Model builders (models/) produce the forward graph.
#include <optional>

#include "graph/autodiff.hpp"
#include "graph/fusion_pass.hpp"
#include "graph/graph.hpp"
#include "graph/optimizer_pass.hpp"

namespace sg {

struct TrainingGraphStages {
  Graph forward;    // e.g. batch fetch, layers, loss
  Graph backward;   // + gradients (autodiff)
  Graph optimized;  // + optimizer updates and the step advance
  Graph fused;      // + fusion groups: what backends execute
};

// `loss` is the forward graph's loss value (the autodiff seed); `step`, when
// given, is a state value the step advances once at its very end (the counter
// the batch fetch reads). Every stage is verified.
TrainingGraphStages build_training_stages(Graph forward, ValueId loss, const OptimizerSpec& sgd,
                                          const FusionOptions& fusion = {},
                                          std::optional<ValueId> step = std::nullopt);

}  // namespace sg
