#include "apps/predict_command.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "apps/backend_choice.hpp"
#include "apps/cli_bounds.hpp"
#include "apps/config/backend_options_from_config.hpp"
#include "apps/saved_model.hpp"
#include "graph/fusion_pass.hpp"
#include "runtime/data/dataset_files.hpp"
#include "runtime/data/npy_array.hpp"
#include "runtime/io/atomic_file.hpp"
#include "runtime/prediction.hpp"
#ifdef STEPGRAPH_HAVE_CUDA
#include "runtime/cuda/cuda_prediction.hpp"
#endif

namespace sg::app {
namespace {

// The table padded with zero rows to a multiple of `batch` (the graph's
// batch fetch covers whole batches; the padding's outputs are dropped).
data::ImageSet padded(data::ImageSet t, std::int64_t batch) {
  const auto rows = (t.count + batch - 1) / batch * batch;
  t.pixels.resize(static_cast<std::size_t>(rows * t.pixels_per_image()) * dtype_size(t.dtype), 0);
  t.count = rows;
  return t;
}

void softmax_rows(std::vector<float>& v, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t r = 0; r < rows; ++r) {
    float* row = v.data() + r * cols;
    const double top = *std::max_element(row, row + cols);
    double sum = 0;
    for (std::int64_t c = 0; c < cols; ++c) sum += std::exp(double(row[c]) - top);
    for (std::int64_t c = 0; c < cols; ++c) row[c] = static_cast<float>(std::exp(double(row[c]) - top) / sum);
  }
}

}  // namespace

void add_predict_options(CLI::App& cmd, PredictRequest& r) {
  cmd.add_option("--checkpoint", r.checkpoint, "checkpoint written by stepgraph train (run.checkpoint)")->required();
  cmd.add_option("-i,--input", r.input, "features: x.npy (N x D or N x C x H x W) or file.npz:array")->required();
  cmd.add_option("-o,--out", r.out, "predictions .npy to write (f32 [N, outputs])")->required();
  cmd.add_option("--backend", r.backend, "auto | cuda | cpu")->capture_default_str();
  cmd.add_option("--batch-size", r.batch_size, "rows per forward pass")->capture_default_str()->check(integer_in(1));
  cmd.add_option("--output", r.output, "probabilities | logits (classifiers; regression writes its outputs)")
      ->capture_default_str();
}

int run_predict(const PredictRequest& r) {
  if (r.backend != "auto" && r.backend != "cuda" && r.backend != "cpu")
    throw ConfigError(fmt::format("--backend '{}' is not one of auto, cuda, cpu", r.backend));
  if (r.output != "probabilities" && r.output != "logits")
    throw ConfigError(fmt::format("--output '{}' is not one of probabilities, logits", r.output));
  if (r.batch_size <= 0) throw ConfigError(fmt::format("--batch-size must be >= 1 (got {})", r.batch_size));
  io::check_writable_file(r.out, "-o");
  const SavedModel saved = load_saved_model(r.checkpoint);
  data::ImageSet table = data::read_feature_table("--input", r.input, "x");
  const auto rows = table.count;
  if (table.pixels_per_image() != saved.inputs())
    throw ConfigError(fmt::format("--input {}: {} features per row, but the model in {} takes {} ({})", r.input,
                                  table.pixels_per_image(), r.checkpoint, saved.inputs(),
                                  saved.sequential ? "model.input" : "model.layers[0]"));
  const bool trained_u8 = saved.feature_dtype() == DType::u8;
  if (trained_u8 != (table.dtype == DType::u8))
    throw ConfigError(fmt::format(
        "--input {}: {} features, but the model in {} was trained on {} features (scaled by {} before the first "
        "layer): pass the same kind of data",
        r.input, dtype_name(table.dtype), r.checkpoint, dtype_name(saved.feature_dtype()), saved.input_scale()));

  const bool use_cuda = r.backend == "cuda" || (r.backend == "auto" && cuda_backend_usable());
  if (r.backend == "cuda" && !cuda_backend_usable())
    throw ConfigError("--backend cuda, but no CUDA GPU is available on this machine");
  if (r.backend == "auto" && !use_cuda) spdlog::warn("no CUDA GPU found: predicting on the CPU reference backend");

  const auto batch = std::min(r.batch_size, rows);
  table = padded(std::move(table), batch);
  const ProgramTarget target = use_cuda ? ProgramTarget::cuda : ProgramTarget::cpu;
  PredictionProgram program;
  if (saved.sequential) {  // CNNs, residual graphs (issue 37): the eval forward of the same layers
    SequentialSpec spec = sequential_for_target(*saved.sequential, target);
    spec.feature_dtype = table.dtype;
    spec.batch = batch;
    spec.dataset_rows = table.count;
    program.graph = build_sequential_predict(spec);
  } else {
    MlpSpec spec = mlp_for_target(saved.mlp, target);
    spec.feature_dtype = table.dtype;
    spec.batch = batch;
    spec.dataset_rows = table.count;
    program.graph = build_mlp_predict(spec);
  }
  fuse(program.graph);
  program.features = program.graph.value_named(names::images);
  program.perm = program.graph.value_named(names::perm);
  program.step = program.graph.value_named(names::step);
  program.output = program.graph.outputs().front();
  program.batch = batch;

  std::vector<float> out;
  if (use_cuda) {
#ifdef STEPGRAPH_HAVE_CUDA
    out = cuda::predict_on_cuda(program, saved.params, table, backend_options_from_config(saved.config));
#endif
  } else {
    out = predict_on_cpu(program, saved.params, table);
  }
  const auto k = saved.outputs();
  out.resize(static_cast<std::size_t>(rows * k));
  if (!saved.regression() && r.output == "probabilities") softmax_rows(out, rows, k);
  io::write_file_atomically(r.out, data::npy_bytes_f32({rows, k}, out));
  spdlog::info("wrote {}: {} {} of {} rows ({} backend)", r.out, saved.regression() ? "regression outputs" : r.output,
               fmt::format("[{}, {}]", rows, k), rows, use_cuda ? "cuda" : "cpu");
  return 0;
}

}  // namespace sg::app
