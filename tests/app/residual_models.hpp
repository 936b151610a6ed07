#pragma once
// Residual networks written as a user would (issue 37's model graph), shared
// by the CPU-side and the GPU tests of the model graph.
#include <string>
#include <vector>

#include "apps/config/train_config.hpp"

namespace sg::test {

// 20 -> linear 16 (h) -> relu -> linear 16 (r) -> add h + r -> relu -> linear 5:
// one residual block around the second linear layer.
inline const char* kResidualMlp =
    "model:\n  input: [20]\n  sequential:\n"
    "    - linear: {out: 16, name: h}\n"
    "    - relu\n"
    "    - linear: {out: 16, name: r}\n"
    "    - add: {inputs: [h, r]}\n"
    "    - relu\n"
    "    - linear: {out: 5}\n";

// The same block in a CNN: 1x6x6 -> conv 4 (c1) -> relu -> conv 4 (c2) -> add -> relu -> flatten -> linear 3.
inline const char* kResidualCnn =
    "model:\n  input: [1, 6, 6]\n  sequential:\n"
    "    - conv2d: {out: 4, kernel: 3, padding: 1, name: c1}\n"
    "    - relu\n"
    "    - conv2d: {out: 4, kernel: 3, padding: 1, name: c2}\n"
    "    - add: {inputs: [c1, c2]}\n"
    "    - relu\n"
    "    - flatten\n"
    "    - linear: {out: 3}\n";

// Branches joined by concat (issue 37): 1x8x8 -> conv 4 -> relu (stem) ->
// a 3x3 conv 4 (a) and a 1x1 conv 2 (b) of the stem -> concat [a, b, stem]
// (10 channels) -> relu -> max_pool2d 2 -> flatten -> linear 3.
inline const char* kBranchedCnn =
    "model:\n  input: [1, 8, 8]\n  sequential:\n"
    "    - conv2d: {out: 4, kernel: 3, padding: 1}\n"
    "    - relu: {name: stem}\n"
    "    - conv2d: {out: 4, kernel: 3, padding: 1, name: a}\n"
    "    - conv2d: {out: 2, kernel: 1, inputs: [stem], name: b}\n"
    "    - concat: {inputs: [a, b, stem]}\n"
    "    - relu\n"
    "    - max_pool2d: {kernel: 2}\n"
    "    - flatten\n"
    "    - linear: {out: 3}\n";

// A pre-norm residual MLP (issue 37's layer_norm): 20 -> linear 16 ->
// residual block (layer_norm, linear 16, relu, linear 16) -> layer_norm -> linear 5.
inline const char* kNormedResidualMlp =
    "model:\n  input: [20]\n  sequential:\n"
    "    - linear: {out: 16}\n"
    "    - residual: {layers: [layer_norm, {linear: {out: 16}}, relu, {linear: {out: 16}}]}\n"
    "    - layer_norm: {eps: 0.0001}\n"
    "    - linear: {out: 5}\n";

// Issue 37's poolings in a residual CNN: 1x8x8 -> conv 4 -> relu ->
// residual block (conv, relu, conv) -> relu -> avg_pool2d 2 (4x4) -> conv 6
// -> relu -> global mean (6) -> linear 3.
inline const char* kPooledResidualCnn =
    "model:\n  input: [1, 8, 8]\n  sequential:\n"
    "    - conv2d: {out: 4, kernel: 3, padding: 1}\n"
    "    - relu\n"
    "    - residual: {layers: [{conv2d: {out: 4, kernel: 3, padding: 1}}, relu, "
    "{conv2d: {out: 4, kernel: 3, padding: 1}}]}\n"
    "    - relu\n"
    "    - avg_pool2d: {kernel: 2}\n"
    "    - conv2d: {out: 6, kernel: 3, padding: 1}\n"
    "    - relu\n"
    "    - global_avg_pool2d\n"
    "    - linear: {out: 3}\n";

// Batch normalisation (issue 37) in a residual CNN and before its classifier:
// 1x8x8 -> conv 4 -> batch_norm (2d) -> relu -> residual block (conv,
// batch_norm, relu, conv, batch_norm {momentum 0.2}) -> relu -> max_pool2d 2
// -> flatten (64) -> batch_norm (1d, eps 1e-3) -> linear 3.
inline const char* kBatchNormCnn =
    "model:\n  input: [1, 8, 8]\n  sequential:\n"
    "    - conv2d: {out: 4, kernel: 3, padding: 1}\n"
    "    - batch_norm\n"
    "    - relu\n"
    "    - residual: {layers: [{conv2d: {out: 4, kernel: 3, padding: 1}}, batch_norm, relu, "
    "{conv2d: {out: 4, kernel: 3, padding: 1}}, {batch_norm: {momentum: 0.2}}]}\n"
    "    - relu\n"
    "    - max_pool2d: {kernel: 2}\n"
    "    - flatten\n"
    "    - batch_norm: {eps: 0.001}\n"
    "    - linear: {out: 3}\n";

// Layers without a bias (PyTorch's bias=False) before batch_norm: 1x8x8 ->
// conv 4 (no bias) -> batch_norm -> relu -> flatten (256) -> linear 8 (no
// bias) -> batch_norm -> relu -> linear 3.
inline const char* kBiasFreeCnn =
    "model:\n  input: [1, 8, 8]\n  sequential:\n"
    "    - conv2d: {out: 4, kernel: 3, padding: 1, bias: false}\n"
    "    - batch_norm\n"
    "    - relu\n"
    "    - flatten\n"
    "    - linear: {out: 8, bias: false}\n"
    "    - batch_norm\n"
    "    - relu\n"
    "    - linear: {out: 3}\n";

// The model section plus small-run settings on `backend` (cpu, cuda), as file
// "graph.yaml"; `overrides` as --set gives them (data.augment.translate=1).
inline app::TrainConfig parse_model(const std::string& model_yaml, const std::string& backend = "cpu",
                                    const std::vector<std::string>& overrides = {}) {
  return app::parse_config(model_yaml + "data:\n  batch_size: 16\noptim:\n  lr: 0.05\n  momentum: 0.9\nrun:\n  steps: 10\n"
                                        "precision:\n  weights: fp32\nbackend:\n  kind: " + backend + "\n",
                           "graph.yaml", overrides);
}

}  // namespace sg::test
