#pragma once
// The product's main job: train a configured MLP, evaluate, log progress,
// write metrics, a loss plot and checkpoints; stop cleanly on Ctrl-C and with
// a clear error on a NaN/Inf loss.
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "apps/config/train_config.hpp"
#include "apps/rank_launch.hpp"
#include "apps/report/run_timing.hpp"
#include "runtime/trainer.hpp"

namespace sg::app {

struct TrainingError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct TrainSummary {
  std::string backend;
  std::int64_t steps = 0;           // global step reached
  double final_train_loss = 0;
  EvalResult final_eval;
  double seconds = 0;               // training time (no data loading, no eval)
  double samples_per_second = 0;
  bool interrupted = false;
  report::RunTiming timing;         // wall time per phase of the whole run (printed at the end)
};

struct RunControls {
  const std::atomic<bool>* stop_requested = nullptr;  // set by the SIGINT handler
  bool interactive_progress = false;                  // stdout is a terminal
  // The process makes no CUDA calls after this run (the CLI's train): the run
  // destroys the CUDA context itself, beside writing its outputs, instead of
  // leaving that to the exit (runtime/cuda/device_release.hpp).
  bool release_device_at_end = false;
  // Set when the run starts its training steps (the config, data and backend
  // are ready and config.yaml is written): until then a stop has nothing to
  // checkpoint (the CLI's signal handler exits at once).
  std::atomic<bool>* training_started = nullptr;
};

// `rank_launch`: one rank of a data-parallel run (issue 25) when its world_size
// > 0: every rank trains, rank 0 alone writes config.yaml, metrics, loss.svg
// and checkpoints (and locks run.out_dir). A stop request (controls) ends the
// steps within one launch and an evaluation within one eval batch; the
// summary is then `interrupted` and a checkpoint is written.
TrainSummary run_training(const TrainConfig& config, const RunControls& controls = {},
                          const RankLaunch& rank_launch = {});

// Total steps the run asks for (run.steps, or run.epochs over the training rows).
std::int64_t total_steps(const TrainConfig& config, std::int64_t train_rows);

}  // namespace sg::app
