#pragma once
// The pipeline from an MLP spec to the training-step graph, keeping every
// stage so it can be inspected: forward -> autodiff -> optimizer -> fusion.
#include "graph/autodiff.hpp"
#include "graph/fusion_pass.hpp"
#include "graph/graph.hpp"
#include "graph/mlp_builder.hpp"
#include "graph/optimizer_pass.hpp"

namespace sg {

struct TrainingGraphStages {
  Graph forward;    // batch fetch, layers, loss
  Graph backward;   // + gradients (autodiff)
  Graph optimized;  // + sgd updates and step advance
  Graph fused;      // + fusion groups: what backends execute
};

TrainingGraphStages build_training_stages(const MlpSpec& mlp, const SgdSpec& sgd,
                                          const FusionOptions& fusion = {});

}  // namespace sg
