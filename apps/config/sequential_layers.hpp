#pragma once
// model.sequential's layers (LayerConfig, as read from YAML) as the model
// builder's LayerSpec list (models/sequential.hpp).
#include <vector>

#include "apps/config/train_config.hpp"
#include "models/sequential.hpp"

namespace sg::app {

// Layer kinds are those read_layers accepted (an unknown one throws ConfigError).
std::vector<LayerSpec> layer_specs(const std::vector<LayerConfig>& layers);

}  // namespace sg::app
