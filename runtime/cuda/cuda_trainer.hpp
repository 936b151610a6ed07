#pragma once
// The CUDA backend behind the Trainer interface: the program's fused
// training-step graph lowered once, captured into a CUDA graph (K steps per
// graph) and replayed; plain stream launches of the same schedule on request.
// The program must be built for this backend (f16 or bf16 activations; models/ builds
// it with ProgramTarget::cuda). Beyond Trainer it exposes what the bench and
// inspect commands need.
#include <memory>
#include <string>
#include <vector>

#include "runtime/trainer.hpp"

namespace sg::cuda {

class CudaProgram;

struct LaunchTiming {
  std::string label;
  double ms = 0;
};

// What `stepgraph profile` reads (profile_launches): per repeat, every launch
// of the step timed by its own pair of CUDA events, and the same step timed
// whole by stream launches and by graph replay.
struct LaunchSamples {
  std::vector<double> start_us;  // from the first launch's start event of the same repeat
  std::vector<double> dur_us;    // start event -> end event around this launch alone
};
struct StepProfile {
  std::vector<LaunchSamples> launches;  // schedule order
  std::vector<double> stream_step_us;   // all launches on the stream, events only before the first and after the last
  std::vector<double> replay_step_us;   // one-step graph replay, an event pair per replay (empty without CUDA graphs)
  double replay_back_to_back_us = 0;    // `repeats` replays back to back / repeats (0 without CUDA graphs)
};

class CudaTrainer final : public Trainer {
 public:
  CudaTrainer(const TrainerSpec& spec, const Dataset& data);
  ~CudaTrainer() override;

  std::string description() const override;
  std::vector<std::pair<std::string, std::string>> declined_fast_paths() const override;
  void train(std::int64_t steps) override;
  double last_loss() override;
  EvalResult evaluate_cancellable(const EvalStopCheck& stop_requested) override;
  void set_learning_rate(double lr) override;
  void gather_shards() override;
  std::vector<io::TensorBlob> save_state() override;
  void load_state(const std::vector<io::TensorBlob>& blobs) override;
  std::int64_t step() const override { return step_; }
  std::int64_t first_nonfinite_step() override;
  std::vector<std::pair<std::string, double>> setup_phases() const override;

  // Runs `steps` steps by graph replay or by stream launches regardless of
  // the spec's choice (for benchmarks), without epoch reshuffles.
  void replay_steps(std::int64_t steps);
  void launch_steps(std::int64_t steps);
  void synchronize() const;
  void* stream_handle() const;  // cudaStream_t
  // GPU time of every launch of a step: stream mode with CUDA events around
  // each launch, queued behind a busy-wait so host launch gaps do not count;
  // the median over `repeats` steps. A whole-step kernel reports its phases
  // (GPU clock at each grid barrier) instead.
  std::vector<LaunchTiming> profile_step(int repeats = 5);
  // `repeats` steps timed launch by launch, then `repeats` by stream launches
  // and (with CUDA graphs) by replay, every step queued behind a busy-wait so
  // host enqueue gaps do not count. Runs 4 * repeats steps (no reshuffles).
  StepProfile profile_launches(int repeats);
  // cudaGraphDebugDotPrint of the one-step graph; returns its node count.
  std::size_t dump_cuda_graph(const std::string& path) const;
  std::size_t cuda_graph_nodes() const;
  const CudaProgram& training_program() const;
  // Poisons the activation arena (NaN bytes) before the next step.
  void poison_activations();

 private:
  struct Impl;
  // Where auto's layout is timed at start-up: both forms built and timed,
  // the state of the faster kept (timed_layout_choice.cpp), released to the caller (Impl is incomplete there).
  static Impl* faster_layout(const TrainerSpec& spec, const Dataset& data);
  void note_layout_timing(std::string choice, double seconds);  // the description's layout line, a setup phase
  std::unique_ptr<Impl> impl_;
  std::int64_t step_ = 0;
};

// Throws std::invalid_argument when spec.program does not fit `data` or this backend.
std::unique_ptr<Trainer> make_cuda_trainer(const TrainerSpec& spec, const Dataset& data);

}  // namespace sg::cuda
