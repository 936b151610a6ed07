#pragma once
// A trained model as `stepgraph predict` and `stepgraph export` read it from
// a checkpoint: the saved config (layers, activation, dropout, loss, input
// scaling), the feature dtype it was trained on and the parameters as f32.
// Every model: a model.layers MLP, or a model.sequential network (issue 37:
// CNNs, residual graphs), whose layers the config's builder makes again.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "apps/config/train_config.hpp"
#include "graph/dtype.hpp"
#include "models/mlp.hpp"
#include "models/sequential.hpp"
#include "runtime/export/exported_graph.hpp"
#include "runtime/export/exported_mlp.hpp"
#include "runtime/io/checkpoint.hpp"

namespace sg::app {

// Checkpoint entry holding the dtype name ("u8", "f16", "f32") of the feature
// table the model was trained on (u8 [len], the name's bytes). Its dot keeps
// it apart from any graph value name. Checkpoints without it (written before
// issue 23, IDX data only) mean u8.
inline constexpr const char* kFeatureDtypeEntry = "data.feature_dtype";
io::TensorBlob feature_dtype_blob(DType dtype);
// The checkpoint's tensors without kFeatureDtypeEntry (what a trainer restores).
std::vector<io::TensorBlob> without_feature_dtype(std::vector<io::TensorBlob> tensors);

struct SavedModel {
  TrainConfig config;  // the run's resolved config
  // model.layers: model, input scaling and feature dtype as trained (batch/rows unset).
  MlpSpec mlp;
  std::vector<exporting::DenseLayer> layers;  // model.layers' dense layers
  // model.sequential: the layers, input scaling and feature dtype as trained (batch/rows unset).
  std::optional<SequentialSpec> sequential;
  std::vector<io::TensorBlob> params;  // w1, b1, ... (and batch_norm's running_mean<k>, running_var<k>) as stored
  std::int64_t steps = 0;              // training steps taken (batch_norm's num_batches_tracked)
  bool regression() const { return (sequential ? sequential->target_width : mlp.target_width) > 0; }
  std::int64_t inputs() const { return sequential ? element_count(sequential->input_shape) : mlp.layers.front(); }
  std::int64_t outputs() const { return sequential ? config.model.classes : mlp.layers.back(); }
  DType feature_dtype() const { return sequential ? sequential->feature_dtype : mlp.feature_dtype; }
  double input_scale() const { return sequential ? sequential->input_scale : mlp.input_scale; }
};

// Throws (ConfigError / io::IoError) naming the file when it is not a
// readable checkpoint or its parameters do not match its config.
SavedModel load_saved_model(const std::filesystem::path& checkpoint);

// The model a checkpoint of `config` would hold before its first step: the
// initial parameters of run.seed, for features of `features` (what `bench
// --torch` exports for PyTorch's twin of the network).
SavedModel initial_model(const TrainConfig& config, DType features);

// What the exporters take (runtime/export/exported_mlp.hpp). Throws
// ConfigError for a model.sequential model: see exported_graph.
exporting::ExportedMlp exported_mlp(const SavedModel& model);
// A model.sequential model as the exporters take it
// (runtime/export/exported_graph.hpp); throws ConfigError for an MLP.
exporting::ExportedGraph exported_graph(const SavedModel& model);

}  // namespace sg::app
