#pragma once
// The checkpoint a run resumes from (run.resume), checked against the run's
// config before any data is read: a key that would train it differently from
// the run that wrote it is refused, naming the key; a run.* key that only
// reshapes what comes after the checkpoint (the total steps of a cosine
// schedule, the dropout seed) is a warning.
#include <cstdint>
#include <string>
#include <vector>

#include "apps/config/train_config.hpp"
#include "runtime/io/checkpoint.hpp"

namespace sg::app {

struct ResumePoint {
  io::Checkpoint checkpoint;
  TrainConfig saved;  // the config of the run that wrote it
};

// `world_size`: this run's data-parallel ranks (0 for a single process).
// Throws ConfigError (or the checkpoint reader's error) naming run.resume.
ResumePoint load_resume_point(const TrainConfig& config, int world_size);

// One line per run.* key whose change makes the resumed run follow another
// course than the checkpoint's run would have: run.steps / run.epochs under a
// cosine schedule (`total_steps` here and `saved_total_steps` there), run.seed
// with dropout (its masks are keyed on it).
std::vector<std::string> resume_trajectory_warnings(const TrainConfig& config, const ResumePoint& resume,
                                                    std::int64_t total_steps, std::int64_t saved_total_steps);

}  // namespace sg::app
