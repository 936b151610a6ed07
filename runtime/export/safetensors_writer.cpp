#include "runtime/export/safetensors_writer.hpp"

#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace sg::exporting {
namespace {

// The file: header (with `metadata`) and data, tensors in the order add() takes them.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(nlohmann::ordered_json metadata) { header_["__metadata__"] = std::move(metadata); }
  void add(const std::string& name, const std::vector<std::int64_t>& shape, const std::vector<float>& values) {
    const auto begin = data_.size();
    data_.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
    header_[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {begin, data_.size()}}};
  }
  void add_scalar(const std::string& name, std::int64_t value) {  // I64, shape [] (a little-endian host)
    const auto begin = data_.size();
    data_.append(reinterpret_cast<const char*>(&value), sizeof value);
    header_[name] = {{"dtype", "I64"}, {"shape", nlohmann::json::array()}, {"data_offsets", {begin, data_.size()}}};
  }
  std::string bytes() const {
    std::string text = header_.dump();
    text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
    std::string out(8, '\0');
    const std::uint64_t n = text.size();
    for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
    return out + text + data_;
  }

 private:
  nlohmann::ordered_json header_;
  std::string data_;
};

}  // namespace

std::string safetensors_bytes(const ExportedMlp& model) {
  SafetensorsFile f({
      {"format", "pt"},
      {"stepgraph.torch_module", torch_sequential_text(model)},
      {"stepgraph.input_scale", fmt::format("{}", model.input_scale)},
      {"stepgraph.input_shift", fmt::format("{}", model.input_shift)},
      {"stepgraph.activation", model.activation},
  });
  const auto indices = torch_linear_indices(model);
  for (std::size_t l = 0; l < model.layers.size(); ++l) {
    const auto& layer = model.layers[l];
    f.add(fmt::format("{}.weight", indices[l]), {layer.out, layer.in}, layer.weight);
    f.add(fmt::format("{}.bias", indices[l]), {layer.out}, layer.bias);
  }
  return f.bytes();
}

std::string safetensors_bytes(const ExportedGraph& model) {
  SafetensorsFile f({
      {"format", "pt"},
      {"stepgraph.torch_module", torch_module_code(model)},
      {"stepgraph.input_scale", fmt::format("{}", model.input_scale)},
      {"stepgraph.input_shift", fmt::format("{}", model.input_shift)},
  });
  for (std::size_t i = 0; i < model.layers.size(); ++i) {
    const GraphLayer& l = model.layers[i];
    if (l.weight.empty()) continue;
    f.add(graph_parameter_name(i, "weight"), l.weight_shape, l.weight);
    if (!l.bias.empty()) f.add(graph_parameter_name(i, "bias"), l.bias_shape, l.bias);
    if (l.kind == "batch_norm") {  // nn.BatchNorm's buffers, in its state_dict order
      f.add(graph_parameter_name(i, "running_mean"), l.bias_shape, l.running_mean);
      f.add(graph_parameter_name(i, "running_var"), l.bias_shape, l.running_var);
      f.add_scalar(graph_parameter_name(i, "num_batches_tracked"), l.num_batches_tracked);
    }
  }
  return f.bytes();
}

}  // namespace sg::exporting
