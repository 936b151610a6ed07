#pragma once
// Step one of parse_config: the YAML tree's values into a TrainConfig's
// fields (types checked, model.sequential's layers and their options
// resolved); cross-key rules are validate_config's.
#include <yaml-cpp/yaml.h>

#include "apps/config/config_reader.hpp"
#include "apps/config/train_config.hpp"

namespace sg::app {

void read_all(const ConfigReader& r, const YAML::Node& root, TrainConfig& c);

}  // namespace sg::app
