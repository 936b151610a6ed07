#include "apps/export_command.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "apps/config/train_config.hpp"
#include "apps/saved_model.hpp"
#include "runtime/export/onnx_writer.hpp"
#include "runtime/export/safetensors_writer.hpp"
#include "runtime/io/atomic_file.hpp"

namespace sg::app {

void add_export_options(CLI::App& cmd, ExportRequest& r) {
  cmd.add_option("--checkpoint", r.checkpoint, "checkpoint written by stepgraph train (run.checkpoint)")->required();
  cmd.add_option("-f,--format", r.format, "safetensors | onnx")->capture_default_str();
  cmd.add_option("-o,--out", r.out, "file to write")->required();
}

int run_export(const ExportRequest& r) {
  if (r.format != "safetensors" && r.format != "onnx")
    throw ConfigError(fmt::format("--format '{}' is not one of safetensors, onnx", r.format));
  // Without ONNX in this build, onnx_bytes throws the one-line reason: before reading anything.
  if (r.format == "onnx" && !exporting::onnx_export_available()) exporting::onnx_bytes({});
  io::check_writable_file(r.out, "-o");
  const SavedModel saved = load_saved_model(r.checkpoint);
  const exporting::ExportedMlp model = exported_mlp(saved);
  const std::string bytes = r.format == "onnx" ? exporting::onnx_bytes(model) : exporting::safetensors_bytes(model);
  io::write_file_atomically(r.out, bytes);
  spdlog::info("wrote {} ({}, {} bytes) from {}", r.out, r.format, bytes.size(), r.checkpoint);
  spdlog::info("model: {}; it expects inputs scaled as {} ({} features, {})", exporting::torch_sequential_text(model),
               exporting::input_scaling_text(model), saved.inputs(),
               r.format == "onnx" ? (model.regression ? "ONNX input 'input', output 'outputs'"
                                                      : "ONNX input 'input', outputs 'logits' and 'probabilities'; "
                                                        "the scaling is inside the graph")
                                  : "PyTorch: load_state_dict(safetensors.torch.load_file(...)); scale inputs yourself");
  return 0;
}

}  // namespace sg::app
