#pragma once
// Which permutation the in-graph batch fetch must see: batches of epoch e
// come from epoch_permutation(rows, seed, e); the host uploads a new one only
// when a step crosses into another epoch (no re-capture, no per-step work).
#include <cstdint>
#include <optional>
#include <vector>

namespace sg {

class EpochSchedule {
 public:
  EpochSchedule(std::int64_t rows, std::int64_t batch, std::uint64_t seed);
  std::int64_t batches_per_epoch() const { return batches_per_epoch_; }
  // Steps that can run from `step` before the permutation must change.
  std::int64_t steps_left_in_epoch(std::int64_t step) const;
  // The permutation for `step` if it differs from the one last handed out.
  std::optional<std::vector<std::int32_t>> permutation_if_changed(std::int64_t step);

 private:
  std::int64_t rows_, batches_per_epoch_;
  std::uint64_t seed_;
  std::int64_t current_epoch_ = -1;
};

}  // namespace sg
