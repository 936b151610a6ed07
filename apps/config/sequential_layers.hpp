#pragma once
// model.sequential's layers (LayerConfig, as read from YAML) as the model
// builder's LayerSpec list (models/sequential.hpp), each residual block (the
// short form, issue 37) expanded into the layers it stands for.
#include <cstddef>
#include <string>
#include <vector>

#include "apps/config/train_config.hpp"
#include "models/sequential.hpp"

namespace sg::app {

// The builder's layers and, for each, where the config wrote it: its path
// ("model.sequential[2].residual.layers[1].conv2d"; a block's add is
// "model.sequential[2].residual") and the index of its model.sequential
// entry. A residual block becomes its layers (the first reading the block's
// input: the layer before, its `inputs` entry, or the model's input), its
// projection (on the block's input) and an add of the two branches, named
// as the block; a layer the block has to refer to and that has no name gets
// one from the block's path ("sequential[2].residual.input", ".body",
// ".projection").
struct ExpandedLayers {
  std::vector<LayerSpec> specs;
  std::vector<std::string> paths;
  std::vector<std::size_t> entries;
};
// Layer kinds are those read_layers accepted (an unknown one throws ConfigError).
ExpandedLayers expand_layers(const std::vector<LayerConfig>& layers);
std::vector<LayerSpec> layer_specs(const std::vector<LayerConfig>& layers);  // expand_layers(layers).specs

}  // namespace sg::app
