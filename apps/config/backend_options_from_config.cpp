#include "apps/config/backend_options_from_config.hpp"

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace sg::app {

BackendOptions backend_options_from_config(const BackendConfig& b, const PrecisionConfig& precision) {
  BackendOptions o;
  o.accumulate_f16 = precision.accumulate == "fp16";
  o.autotune = b.autotune;
  o.steps_per_launch = b.steps_per_launch;
  o.whole_step = b.whole_step;
  try {
    o.whole_step_mode = whole_step_mode_from_name(b.whole_step_mode);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(fmt::format("backend.whole_step_mode: {}", e.what()));
  }
  o.one_pass_backward = b.one_pass_backward;
  o.small_batch_forward = b.small_batch_forward;
  o.fold_input_update = b.fold_input_update;
  try {
    o.conv_kernels = conv_kernels_from_name(b.conv_kernels);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(fmt::format("backend.conv_kernels: {}", e.what()));
  }
  o.dependent_launch = b.dependent_launch;
  o.classifier_mma = b.classifier_mma;
  o.one_pass_multicast = b.one_pass_multicast;
  // load_config validated these; a config built in code is checked here.
  if (std::string why = strip_splits_problem(b.strip_splits); !why.empty())
    throw ConfigError(fmt::format("backend.strip_splits: {}", why));
  if (std::string why = resident_cluster_problem(b.resident_cluster); !why.empty())
    throw ConfigError(fmt::format("backend.resident_cluster: {}", why));
  o.strip_splits = int(b.strip_splits);
  o.resident_cluster = int(b.resident_cluster);
  return o;
}

}  // namespace sg::app
