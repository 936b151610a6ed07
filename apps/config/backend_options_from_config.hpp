#pragma once
// The `backend:` section's typed options, read row by row from the backend
// option table (runtime/backend_option_table.hpp): no key is listed here.
#include <yaml-cpp/yaml.h>

#include "apps/config/config_reader.hpp"
#include "apps/config/train_config.hpp"
#include "runtime/backend_options.hpp"

namespace sg::app {

// Reads every table row's key of `backend` (the section's node) into `options`;
// a wrong type or a value the row refuses is a ConfigError naming file, line and key.
void read_backend_options(const ConfigReader& reader, const YAML::Node& backend, BackendOptions& options);

// A validated config's backend options (precision.accumulate already mapped
// onto accumulate_f16 when it was read).
inline BackendOptions backend_options_from_config(const TrainConfig& config) { return config.backend.options; }

}  // namespace sg::app
