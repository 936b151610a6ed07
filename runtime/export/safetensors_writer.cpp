#include "runtime/export/safetensors_writer.hpp"

#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace sg::exporting {

std::string safetensors_bytes(const ExportedMlp& model) {
  nlohmann::ordered_json header;
  header["__metadata__"] = {
      {"format", "pt"},
      {"stepgraph.torch_module", torch_sequential_text(model)},
      {"stepgraph.input_scale", fmt::format("{}", model.input_scale)},
      {"stepgraph.input_shift", fmt::format("{}", model.input_shift)},
      {"stepgraph.activation", model.activation},
  };
  std::string data;
  const auto indices = torch_linear_indices(model);
  auto add = [&](const std::string& name, std::vector<std::int64_t> shape, const std::vector<float>& values) {
    const auto begin = data.size();
    data.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
    header[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {begin, data.size()}}};
  };
  for (std::size_t l = 0; l < model.layers.size(); ++l) {
    const auto& layer = model.layers[l];
    add(fmt::format("{}.weight", indices[l]), {layer.out, layer.in}, layer.weight);
    add(fmt::format("{}.bias", indices[l]), {layer.out}, layer.bias);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::string out(8, '\0');
  std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + text + data;
}

}  // namespace sg::exporting
