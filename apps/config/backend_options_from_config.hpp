#pragma once
// The typed backend options of a validated config: its `backend:` section
// and precision.accumulate (fp16: cuBLASLt accumulates in fp16).
#include "apps/config/train_config.hpp"
#include "runtime/backend_options.hpp"

namespace sg::app {

BackendOptions backend_options_from_config(const BackendConfig& backend, const PrecisionConfig& precision);
inline BackendOptions backend_options_from_config(const TrainConfig& config) {
  return backend_options_from_config(config.backend, config.precision);
}

}  // namespace sg::app
