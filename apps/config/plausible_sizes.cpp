#include "apps/config/plausible_sizes.hpp"

#include <fmt/format.h>

#include "apps/config/sequential_layers.hpp"
#include "models/layer_graph.hpp"
#include "models/sequential.hpp"

namespace sg::app {
namespace {

YAML::Node model_key(const YAML::Node& root, const char* key) {
  const YAML::Node model = section_of(root, "model");
  return model && model.IsMap() && model[key] ? model[key] : root;
}

// The node of list entry `i` when the list is there, for its line number.
YAML::Node entry_of(const YAML::Node& list, std::size_t i, const YAML::Node& fallback) {
  return list.IsSequence() && i < list.size() ? list[i] : fallback;
}

void check_model_layers(const ConfigReader& r, const YAML::Node& root, const ModelConfig& m) {
  const YAML::Node list = model_key(root, "layers");
  if (static_cast<std::int64_t>(m.layers.size()) > kMaxModelLayers)
    r.fail(list, "model.layers",
           fmt::format("has {} entries; at most {} (the input, the hidden layers, the outputs)", m.layers.size(),
                       kMaxModelLayers));
  for (std::size_t i = 0; i < m.layers.size(); ++i)
    if (m.layers[i] > kMaxLayerWidth)
      r.fail(entry_of(list, i, list), "model.layers",
             fmt::format("entry {} ({}) is wider than the {} features a layer may have", i, m.layers[i], kMaxLayerWidth));
  if (m.hidden_depth > kMaxModelLayers - 2)
    r.fail(model_key(root, "hidden_depth"), "model.hidden_depth",
           fmt::format("{} hidden layers; at most {}", m.hidden_depth, kMaxModelLayers - 2));
  for (const auto& [key, value] : {std::pair{"hidden_width", m.hidden_width}, {"input", m.input}, {"classes", m.classes}})
    if (value > kMaxLayerWidth)
      r.fail(model_key(root, key), fmt::format("model.{}", key),
             fmt::format("{} is wider than the {} features a layer may have", value, kMaxLayerWidth));
}

void check_sequential(const ConfigReader& r, const YAML::Node& root, const ModelConfig& m) {
  const YAML::Node list = model_key(root, "sequential");
  const ExpandedLayers layers = expand_layers(m.sequential);  // residual blocks as the layers they stand for
  if (static_cast<std::int64_t>(layers.specs.size()) > kMaxModelLayers)
    r.fail(list, "model.sequential", fmt::format("has {} layers; at most {}", layers.specs.size(), kMaxModelLayers));
  const YAML::Node input = model_key(root, "input");
  if (m.input_shape.size() > 3)
    r.fail(input, "model.input", fmt::format("has {} entries; at most 3 ([C, H, W] or [features])", m.input_shape.size()));
  double input_elements = 1;
  for (auto d : m.input_shape) {
    if (d > kMaxLayerWidth)
      r.fail(input, "model.input", fmt::format("{} is larger than the {} a dimension may be", d, kMaxLayerWidth));
    input_elements *= static_cast<double>(d);
  }
  if (input_elements > kMaxExampleElements)
    r.fail(input, "model.input",
           fmt::format("{:.0f} values per example; at most {:.0f}", input_elements, kMaxExampleElements));
  for (std::size_t i = 0; i < layers.specs.size(); ++i) {
    const LayerSpec& l = layers.specs[i];
    const std::string& at = layers.paths[i];
    const YAML::Node node = entry_of(list, layers.entries[i], list);
    if (l.out > kMaxLayerWidth)
      r.fail(node, at + ".out", fmt::format("{} is more than the {} outputs a layer may have", l.out, kMaxLayerWidth));
    for (const auto& [key, value] : {std::pair{"kernel", l.kernel}, {"stride", l.stride}, {"padding", l.padding}})
      if (value > kMaxKernel) r.fail(node, at + "." + key, fmt::format("{} is more than {}", value, kMaxKernel));
  }
  // Every layer's per-example output and weights, in floating point (no overflow); a
  // layer that does not fit its input is validate's to report.
  std::vector<Shape> shapes;
  std::vector<std::vector<std::int64_t>> reads;  // the layers each layer reads (models/layer_graph.hpp)
  const Shape input_shape = m.input_shape.empty() ? Shape{m.input} : m.input_shape;
  try {
    shapes = infer_sequential_shapes(input_shape, layers.specs);
    reads = layer_inputs(layers.specs);
  } catch (const std::exception&) {  // GraphError, ConfigError: validate reports them with their own message
    return;
  }
  for (std::size_t i = 0; i < shapes.size() && i < layers.specs.size(); ++i) {
    const LayerSpec& l = layers.specs[i];
    double out = 1;
    for (auto d : shapes[i]) out *= static_cast<double>(d);
    const std::int64_t first = reads[i].front();  // the input the layer's weights see
    const Shape& read = first < 0 ? input_shape : shapes[static_cast<std::size_t>(first)];
    double in = 1;
    for (auto d : read) in *= static_cast<double>(d);
    const double in_channels = static_cast<double>(read.front());
    const double weights = l.kind == LayerKind::linear ? in * static_cast<double>(l.out)
                           : l.kind == LayerKind::conv2d
                               ? in_channels * static_cast<double>(l.out) * static_cast<double>(l.kernel * l.kernel)
                           : l.kind == LayerKind::layer_norm ? in
                           : l.kind == LayerKind::batch_norm ? in_channels
                                                             : 0.0;
    const std::string& at = layers.paths[i];
    const YAML::Node node = entry_of(list, layers.entries[i], list);
    if (out > kMaxExampleElements)
      r.fail(node, at, fmt::format("gives {:.0f} values per example; at most {:.0f}", out, kMaxExampleElements));
    if (weights > kMaxLayerParameters)
      r.fail(node, at, fmt::format("has {:.0f} weights; at most {:.0f}", weights, kMaxLayerParameters));
  }
}

}  // namespace

void check_plausible_sizes(const ConfigReader& r, const YAML::Node& root, const TrainConfig& c) {
  if (c.model.sequential.empty()) check_model_layers(r, root, c.model);
  else check_sequential(r, root, c.model);
  const YAML::Node data = section_of(root, "data");
  for (const auto& [key, value] : {std::pair{"batch_size", c.data.batch_size}, {"eval_batch_size", c.data.eval_batch_size}})
    if (value > kMaxBatch)
      r.fail(data && data.IsMap() && data[key] ? data[key] : root, fmt::format("data.{}", key),
             fmt::format("{} rows; at most {}", value, kMaxBatch));
}

}  // namespace sg::app
