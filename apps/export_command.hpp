#pragma once
// `stepgraph export`: a checkpoint's model as safetensors (PyTorch
// nn.Sequential state_dict names and layouts) or ONNX (the eval graph with
// its input scaling), written atomically (runtime/export/).
#include <CLI/CLI.hpp>

#include <string>

namespace sg::app {

struct ExportRequest {
  std::string checkpoint;
  std::string format = "safetensors";  // safetensors | onnx
  std::string out;
  // model.sequential: each batch_norm after a conv2d or linear layer folded
  // into it (runtime/export/batch_norm_folding.hpp), in either format.
  bool fold_batch_norm = false;
};

void add_export_options(CLI::App& cmd, ExportRequest& request);
// Returns the exit code; throws with one clear line on bad input.
int run_export(const ExportRequest& request);

}  // namespace sg::app
