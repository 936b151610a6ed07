#pragma once
// Step two of parse_config: the rules between keys and the value ranges,
// checked on the values read_all filled in (and the model's derived sizes
// resolved: model.layers from the width form, model.classes from the last
// layer of model.sequential).
#include <yaml-cpp/yaml.h>

#include "apps/config/config_reader.hpp"
#include "apps/config/train_config.hpp"

namespace sg::app {

void validate(const ConfigReader& r, const YAML::Node& root, TrainConfig& c);

}  // namespace sg::app
