#pragma once
// Environment switches that turn one lowering off ("0"), for the
// benchmark's same-run baselines (SG_DEPENDENT_LAUNCH, SG_SMALL_BATCH_FORWARD,
// SG_FOLD_INPUT_UPDATE, SG_CLASSIFIER_MMA, SG_ONE_PASS_MULTICAST). Any other
// value, or none, leaves it on.
#include <cstdlib>
#include <string_view>

namespace sg::cuda {

inline bool switched_off(const char* variable) {
  const char* setting = std::getenv(variable);
  return setting && std::string_view(setting) == "0";
}

}  // namespace sg::cuda
