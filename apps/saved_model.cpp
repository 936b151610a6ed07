#include "apps/saved_model.hpp"

#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "apps/backend_choice.hpp"
#include "models/layer_graph.hpp"
#include "runtime/io/atomic_file.hpp"
#include "runtime/tensor_blob.hpp"

namespace sg::app {

io::TensorBlob feature_dtype_blob(DType dtype) {
  const std::string name(dtype_name(dtype));
  return {kFeatureDtypeEntry, DType::u8, {static_cast<std::int64_t>(name.size())}, name};
}

std::vector<io::TensorBlob> without_feature_dtype(std::vector<io::TensorBlob> tensors) {
  std::erase_if(tensors, [](const io::TensorBlob& b) { return b.name == kFeatureDtypeEntry; });
  return tensors;
}

namespace {

// Tensor `name` of `tensors`, or null.
const io::TensorBlob* find_tensor(const std::vector<io::TensorBlob>& tensors, const std::string& name) {
  for (const auto& b : tensors)
    if (b.name == name) return &b;
  return nullptr;
}

// A model.sequential model's parameters: the names and shapes its builder gives them.
void load_sequential_params(const std::string& source, const std::vector<io::TensorBlob>& tensors, SavedModel& m) {
  for (const ParameterInit& p : sequential_initial_parameters(m.sequential->input_shape, m.sequential->layers, 0)) {
    const io::TensorBlob* blob = find_tensor(tensors, p.name);
    if (!blob)
      throw io::IoError(
          fmt::format("{}: no parameter '{}' (the model.sequential layers of its config)", source, p.name));
    if (blob->shape != p.shape)
      throw io::IoError(fmt::format("{}: parameter '{}' is {} but the config's model.sequential makes it {}", source,
                                    p.name, shape_string(blob->shape), shape_string(p.shape)));
    m.params.push_back(*blob);
  }
}

// m.config's model (sequential or model.layers) for features of `features`,
// its parameters taken from `tensors` by name and shape (`source` names
// them in errors): a checkpoint's, or the initial ones.
void load_model(const std::string& source, const std::vector<io::TensorBlob>& tensors, DType features,
                SavedModel& m) {
  if (m.config.model.is_sequential()) {
    m.sequential = sequential_training(m.config, features).model;
    load_sequential_params(source, tensors, m);
    return;
  }
  m.mlp = mlp_training(m.config, features).mlp;
  const auto& sizes = m.mlp.layers;
  for (std::size_t l = 1; l < sizes.size(); ++l) {
    exporting::DenseLayer layer;
    layer.in = sizes[l - 1];
    layer.out = sizes[l];
    for (const auto& [name, shape, dst] : {std::tuple{names::weight(l), Shape{layer.out, layer.in}, &layer.weight},
                                           std::tuple{names::bias(l), Shape{layer.out}, &layer.bias}}) {
      const io::TensorBlob* blob = find_tensor(tensors, name);
      if (!blob)
        throw io::IoError(fmt::format("{}: no parameter '{}' (model.layers {} in its config)", source, name,
                                      fmt::format("{}", fmt::join(sizes, ","))));
      if (blob->shape != shape)
        throw io::IoError(fmt::format("{}: parameter '{}' is {} but the config's model.layers make it {}", source,
                                      name, shape_string(blob->shape), shape_string(shape)));
      *dst = floats_from_blob(*blob);
      m.params.push_back(*blob);
    }
    m.layers.push_back(std::move(layer));
  }
}

}  // namespace

SavedModel load_saved_model(const std::filesystem::path& path) {
  const io::Checkpoint ckpt = io::load_checkpoint(path);
  SavedModel m;
  try {
    m.config = parse_config(ckpt.config_yaml, path.string() + " (its saved config)");
  } catch (const ConfigError& e) {
    throw ConfigError(fmt::format("{}: cannot read the config saved in the checkpoint: {}", path.string(), e.what()));
  }
  DType features = DType::u8;
  for (const auto& b : ckpt.tensors)
    if (b.name == kFeatureDtypeEntry) {
      try {
        features = dtype_from_name(b.bytes);
      } catch (const std::exception&) {
        throw io::IoError(fmt::format("{}: entry {} holds '{}', not a dtype name", path.string(), kFeatureDtypeEntry,
                                      b.bytes));
      }
    }
  if (find_tensor(ckpt.tensors, kStepEntry)) m.steps = step_from_blobs(ckpt.tensors);
  load_model(path.string(), ckpt.tensors, features, m);
  return m;
}

SavedModel initial_model(const TrainConfig& config, DType features) {
  std::vector<io::TensorBlob> initial;
  const auto keep = [&](const std::vector<ParameterInit>& params) {
    for (const ParameterInit& p : params) initial.push_back(blob_from_floats(p.name, p.shape, DType::f32, p.values));
  };
  if (config.model.is_sequential()) {
    const SequentialSpec spec = sequential_training(config, features).model;
    keep(sequential_initial_parameters(spec.input_shape, spec.layers, config.run.seed));
  } else {
    keep(mlp_initial_parameters(mlp_training(config, features).mlp.layers, config.run.seed));
  }
  SavedModel m;
  m.config = config;
  load_model(config.source + " (its initial parameters)", initial, features, m);
  return m;
}

exporting::ExportedMlp exported_mlp(const SavedModel& model) {
  if (model.sequential)
    throw ConfigError(fmt::format("{}: model.sequential: not a model.layers MLP (exported_graph describes it)",
                                  model.config.source));
  exporting::ExportedMlp e;
  e.layers = model.layers;
  e.activation = std::string(activation_name(model.mlp.activation));
  e.dropout = model.mlp.dropout;
  e.regression = model.regression();
  e.input_scale = model.mlp.input_scale;
  e.input_shift = model.mlp.input_shift;
  return e;
}

}  // namespace sg::app

namespace sg::app {

exporting::ExportedGraph exported_graph(const SavedModel& model) {
  if (!model.sequential) throw ConfigError(fmt::format("{}: not a model.sequential model", model.config.source));
  const SequentialSpec& spec = *model.sequential;
  const auto shapes = infer_sequential_shapes(spec.input_shape, spec.layers);
  const auto reads = layer_inputs(spec.layers);
  exporting::ExportedGraph g;
  g.input_shape = spec.input_shape;
  g.regression = model.regression();
  g.outputs = model.outputs();
  g.input_scale = spec.input_scale;
  g.input_shift = spec.input_shift;
  std::size_t next_param = 0;  // params in layer order (load_sequential_params): w1, b1, w2, b2, ...
  const auto next_values = [&]() { return floats_from_blob(model.params.at(next_param++)); };
  for (std::size_t i = 0; i < spec.layers.size(); ++i) {
    const LayerSpec& l = spec.layers[i];
    exporting::GraphLayer e;
    e.kind = layer_name(l);  // an activation layer: the activation's name
    for (std::int64_t r : reads[i]) e.inputs.push_back(static_cast<int>(r));
    const Shape& in = reads[i].front() < 0 ? Shape(spec.input_shape) : shapes[static_cast<std::size_t>(reads[i].front())];
    e.in = in.front();
    e.out = l.out;
    e.kernel = l.kernel;
    e.stride = layer_stride(l);
    e.padding = l.padding;
    e.p = l.p;
    e.eps = l.eps;
    e.momentum = l.momentum;
    if (l.kind == LayerKind::conv2d || l.kind == LayerKind::linear || l.kind == LayerKind::layer_norm ||
        l.kind == LayerKind::batch_norm) {
      const io::TensorBlob& w = model.params.at(next_param++);
      e.weight_shape = w.shape;
      e.weight = floats_from_blob(w);
      if (l.bias) {  // (a layer_norm or batch_norm always has one)
        const io::TensorBlob& b = model.params.at(next_param++);
        e.bias_shape = b.shape;
        e.bias = floats_from_blob(b);
      }
    }
    if (l.kind == LayerKind::batch_norm) {  // then running_mean<k>, running_var<k>
      e.running_mean = next_values();
      e.running_var = next_values();
      e.num_batches_tracked = model.steps;
      e.spatial = in.size() == 3;
    }
    g.layers.push_back(std::move(e));
  }
  return g;
}

}  // namespace sg::app
