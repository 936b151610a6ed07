#include "apps/lr_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace sg::app {

bool schedule_varies(const OptimConfig& optim) {
  return optim.schedule.kind != "constant" || optim.schedule.warmup_steps > 0;
}

double learning_rate_at(const OptimConfig& optim, std::int64_t step, std::int64_t total_steps) {
  const auto& s = optim.schedule;
  if (s.warmup_steps > 0 && step < s.warmup_steps)
    return optim.lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps);
  if (s.kind == "step") return optim.lr * std::pow(s.gamma, static_cast<double>(step / s.step_size));
  if (s.kind == "cosine") {
    const double span = static_cast<double>(std::max<std::int64_t>(1, total_steps - s.warmup_steps));
    const double t = std::clamp(static_cast<double>(step - s.warmup_steps) / span, 0.0, 1.0);
    return s.min_lr + 0.5 * (optim.lr - s.min_lr) * (1.0 + std::cos(std::numbers::pi * t));
  }
  return optim.lr;
}

}  // namespace sg::app
