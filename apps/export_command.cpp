#include "apps/export_command.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "apps/config/train_config.hpp"
#include "apps/saved_model.hpp"
#include "runtime/export/batch_norm_folding.hpp"
#include "runtime/export/onnx_writer.hpp"
#include "runtime/export/safetensors_writer.hpp"
#include "runtime/io/atomic_file.hpp"

namespace sg::app {

void add_export_options(CLI::App& cmd, ExportRequest& r) {
  cmd.add_option("--checkpoint", r.checkpoint, "checkpoint written by stepgraph train (run.checkpoint)")->required();
  cmd.add_option("-f,--format", r.format, "safetensors | onnx")->capture_default_str();
  cmd.add_option("-o,--out", r.out, "file to write")->required();
  cmd.add_flag("--fold-batch-norm", r.fold_batch_norm,
               "fold each batch_norm that follows a conv2d or linear layer into that layer's weights and bias "
               "(inference only; the module and the ONNX graph then have no such batch_norm)");
}

namespace {

// A model.sequential network (issue 37): safetensors named as the printed module's state_dict;
// ONNX: the same network's eval graph (runtime/export/onnx_writer.hpp).
int export_graph(const ExportRequest& r, const SavedModel& saved) {
  exporting::ExportedGraph model = exported_graph(saved);
  if (r.fold_batch_norm)
    spdlog::info("folded {} batch_norm layers into the conv2d / linear layers before them",
                 exporting::fold_batch_norms(model));
  const std::string code = exporting::torch_module_code(model);  // before writing: a layer it cannot express throws
  const std::string bytes = r.format == "onnx" ? exporting::onnx_bytes(model) : exporting::safetensors_bytes(model);
  io::write_file_atomically(r.out, bytes);
  spdlog::info("wrote {} ({}, {} bytes) from {}", r.out, r.format, bytes.size(), r.checkpoint);
  if (r.format == "onnx") {
    spdlog::info("ONNX input 'input' [N, {}] (rows as predict reads them; the scaling is inside the graph), {}",
                 saved.inputs(),
                 model.regression ? "output 'outputs'" : "outputs 'logits' and 'probabilities'");
    return 0;
  }
  spdlog::info("it is the state_dict of this module (also in the file's __metadata__['stepgraph.torch_module']); "
               "inputs [N, {}] scaled as {}:\n{}",
               fmt::join(model.input_shape, ", "),
               exporting::input_scaling_text(model.input_scale, model.input_shift),
               code);
  return 0;
}

}  // namespace

int run_export(const ExportRequest& r) {
  if (r.format != "safetensors" && r.format != "onnx")
    throw ConfigError(fmt::format("--format '{}' is not one of safetensors, onnx", r.format));
  // Without ONNX in this build, onnx_bytes throws the one-line reason: before reading anything.
  if (r.format == "onnx" && !exporting::onnx_export_available()) exporting::onnx_bytes(exporting::ExportedMlp{});
  io::check_writable_file(r.out, "-o");
  const SavedModel saved = load_saved_model(r.checkpoint);
  if (saved.sequential) return export_graph(r, saved);
  if (r.fold_batch_norm)
    throw ConfigError(fmt::format("{}: --fold-batch-norm: a model.layers MLP has no batch_norm layers", r.checkpoint));
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
