#include "models/layer_graph.hpp"

#include <map>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace sg {
namespace {

// "layer 4 (add 'sum')", as the shape errors name layers.
std::string layer_label(const LayerSpec& l, std::size_t index) {
  return l.name.empty() ? fmt::format("layer {} ({})", index, layer_name(l))
                        : fmt::format("layer {} ({} '{}')", index, layer_name(l), l.name);
}

SequentialShapeError layer_error(const std::vector<LayerSpec>& layers, std::size_t index, const std::string& problem) {
  return SequentialShapeError(static_cast<std::int64_t>(index),
                              fmt::format("{}: {}", layer_label(layers[index], index), problem), problem);
}

}  // namespace

std::vector<std::vector<std::int64_t>> layer_inputs(const std::vector<LayerSpec>& layers) {
  std::map<std::string, std::size_t> named;  // names of the layers so far
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const std::string& name = layers[i].name;
    if (name.empty()) continue;
    if (name == kModelInputName)
      throw layer_error(layers, i, fmt::format("name '{}' is the model's input (in inputs: lists)", name));
    if (auto [it, fresh] = named.try_emplace(name, i); !fresh)
      throw layer_error(layers, i, fmt::format("name '{}' is already layer {}'s", name, it->second));
  }
  std::vector<std::vector<std::int64_t>> result(layers.size());
  std::vector<bool> read(layers.size(), false);
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const LayerSpec& l = layers[i];
    if (l.inputs.empty()) {
      result[i].push_back(static_cast<std::int64_t>(i) - 1);  // the layer before (the first: the model's input)
    } else {
      for (const std::string& input : l.inputs) {
        if (input == kModelInputName) {
          result[i].push_back(-1);
          continue;
        }
        const auto it = named.find(input);
        if (it == named.end()) {
          std::vector<std::string> earlier{kModelInputName};
          for (std::size_t j = 0; j < i; ++j)
            if (!layers[j].name.empty()) earlier.push_back(fmt::format("'{}'", layers[j].name));
          throw layer_error(layers, i, fmt::format("input '{}' names no layer (it may read {})", input,
                                                   fmt::join(earlier, ", ")));
        }
        if (it->second >= i)
          throw layer_error(layers, i,
                            fmt::format("input '{}' is layer {}, {} this one: a layer reads only earlier layers "
                                        "(the list order is the order they run in, so there are no cycles)",
                                        input, it->second, it->second == i ? "that is" : "after"));
        result[i].push_back(static_cast<std::int64_t>(it->second));
      }
    }
    const bool merge = l.kind == LayerKind::add || l.kind == LayerKind::concat;
    if (merge && result[i].size() < 2)
      throw layer_error(layers, i,
                        fmt::format("{} two or more inputs (inputs: [a, b]); it has {}",
                                    l.kind == LayerKind::add ? "adds" : "joins", result[i].size()));
    if (!merge && result[i].size() != 1)
      throw layer_error(layers, i, fmt::format("reads one input; it lists {}", result[i].size()));
    for (std::int64_t j : result[i])
      if (j >= 0) read[static_cast<std::size_t>(j)] = true;
  }
  for (std::size_t i = 0; i + 1 < layers.size(); ++i)
    if (!read[i])
      throw layer_error(layers, i,
                        "no layer reads its output (only the last layer's goes to the loss): name it in a later "
                        "layer's inputs, or remove it");
  return result;
}

}  // namespace sg
