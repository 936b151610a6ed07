#pragma once
// `stepgraph predict`: a checkpoint's model run over the rows of an .npy
// file, batched, on the GPU (the training lowerings) or the CPU reference
// backend; writes f32 class probabilities [N, classes] (or the logits with
// --output logits) or regression outputs [N, K] as .npy, atomically.
#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

namespace sg::app {

struct PredictRequest {
  std::string checkpoint;
  std::string input;                    // x.npy or file.npz:array
  std::string out;                      // preds.npy
  std::string backend = "auto";         // auto | cuda | cpu
  std::int64_t batch_size = 256;
  std::string output = "probabilities";  // probabilities | logits (classifiers)
};

void add_predict_options(CLI::App& cmd, PredictRequest& request);
int run_predict(const PredictRequest& request);

}  // namespace sg::app
