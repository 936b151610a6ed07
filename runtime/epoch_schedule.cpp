#include "runtime/epoch_schedule.hpp"

#include "runtime/random.hpp"

namespace sg {

EpochSchedule::EpochSchedule(std::int64_t rows, std::int64_t batch, std::uint64_t seed)
    : rows_(rows), batches_per_epoch_(rows / batch), seed_(seed) {}

std::int64_t EpochSchedule::steps_left_in_epoch(std::int64_t step) const {
  return batches_per_epoch_ - step % batches_per_epoch_;
}

std::optional<std::vector<std::int32_t>> EpochSchedule::permutation_if_changed(std::int64_t step) {
  const auto epoch = step / batches_per_epoch_;
  if (epoch == current_epoch_) return std::nullopt;
  current_epoch_ = epoch;
  return epoch_permutation(rows_, seed_, static_cast<std::uint64_t>(epoch));
}

}  // namespace sg
