#pragma once
// Learning rate at a given step: optional linear warm-up, then constant,
// step decay or cosine decay to min_lr over the run.
#include <cstdint>

#include "apps/config/train_config.hpp"

namespace sg::app {

double learning_rate_at(const OptimConfig& optim, std::int64_t step, std::int64_t total_steps);
bool schedule_varies(const OptimConfig& optim);

}  // namespace sg::app
