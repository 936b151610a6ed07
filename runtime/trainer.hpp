#pragma once
// What the training app drives, whatever the backend: run steps, read the
// loss, evaluate, change the learning rate, save and restore state.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/backend_options.hpp"
#include "runtime/data/idx_reader.hpp"
#include "runtime/data_parallel_defaults.hpp"
#include "runtime/io/checkpoint.hpp"
#include "runtime/training_program.hpp"

namespace sg {

namespace distributed {
class PeerWatchdog;  // runtime/distributed/peer_watchdog.hpp
}

// This process's place in a data-parallel run (issue 25; CUDA backend with
// NCCL only): rank `rank` of `world_size` on CUDA device `local_rank`, joining
// the NCCL communicator named by `nccl_id` (rank 0's ncclUniqueId, handed out
// by the rendezvous, runtime/distributed/rendezvous.hpp). world_size 0: a
// single-process run, no communicator.
struct DataParallelGroup {
  int rank = 0;
  int world_size = 0;
  int local_rank = 0;
  std::string nccl_id;
  double timeout_s = 300;  // for NCCL setup and each collective enqueue (non-blocking mode)
  // NCCL's non-blocking mode (runtime/cuda/nccl_communicator.hpp): setup
  // and enqueues bounded by timeout_s; off by default (blocking is NCCL's
  // documented capture path).
  bool nonblocking_nccl = false;
  // NCCL's CTAs (blocks) per collective, fixed (ncclConfig_t min/maxCTAs); 0: NCCL's own choice.
  int nccl_ctas = data_parallel_defaults::kNcclCtas;
  // The arena in NCCL symmetric memory (ncclMemAlloc, one registered window), so the all-reduces of two or
  // more ranks run NCCL's symmetric kernels (one ncclSum of the pre-scaled gradients: they do not take ncclAvg).
  bool symmetric_memory = data_parallel_defaults::kSymmetricMemory;
  // Watches the other ranks from the rendezvous on and ends this one when a
  // peer dies or NCCL reports an error; the trainer registers its
  // communicator with it. Null: nothing watches (tests of one rank).
  std::shared_ptr<distributed::PeerWatchdog> watchdog;
};

struct TrainerSpec {
  // The graphs, initial parameters, data bindings and initial learning rate,
  // built for the Dataset's row counts (models/ builds them; checked with
  // check_training_program when a trainer is made).
  TrainingProgram program;
  std::uint64_t shuffle_seed = 1;  // epoch permutations of the training rows
  // CUDA backend only
  bool cuda_graph = true;
  BackendOptions backend;  // lowerings and kernel knobs (steps_per_launch needs cuda_graph)
  DataParallelGroup data_parallel;  // the program must be built for the same rank and world size
};

struct Dataset {
  data::Split train;
  data::Split test;
};

struct EvalResult {
  double loss = 0;
  double accuracy = 0;
  std::int64_t examples = 0;
  // A stop request ended the evaluation early: loss and accuracy cover the
  // `examples` evaluated until then, not the test split.
  bool stopped = false;
};

// Asked between evaluation batches; true ends the evaluation there (Ctrl-C).
using EvalStopCheck = std::function<bool()>;

class Trainer {
 public:
  virtual ~Trainer() = default;
  virtual std::string description() const = 0;
  virtual void train(std::int64_t steps) = 0;
  virtual double last_loss() = 0;  // loss of the most recent step
  // The whole test split, one eval batch at a time.
  EvalResult evaluate() { return evaluate_cancellable({}); }
  // The same, asking `stop_requested` (when set) before every eval batch.
  virtual EvalResult evaluate_cancellable(const EvalStopCheck& stop_requested) = 0;
  virtual void set_learning_rate(double lr) = 0;
  // Parameters, then optimizer state (the step counter excluded), in graph
  // order and by value name, then the global step (i32 [1] kStepEntry).
  virtual std::vector<io::TensorBlob> save_state() = 0;
  // A data-parallel rank with sharded updates (ZeRO-1, issue 38) holds its
  // own range of each sharded parameter and its optimizer state current:
  // this fills the rest from the other ranks. Every rank calls it at the same
  // point, before one of them saves the state (evaluate does it itself).
  // Nothing to do elsewhere.
  virtual void gather_shards() {}
  virtual void load_state(const std::vector<io::TensorBlob>& blobs) = 0;
  virtual std::int64_t step() const = 0;
  // The global step (the step count just after it) of the first training
  // step whose loss was NaN or infinite, or -1 if none was. Every step is
  // checked (the CUDA backend checks on the device after every launch); the
  // value is read when the host next asks, which may synchronize.
  virtual std::int64_t first_nonfinite_step() = 0;
  // Wall seconds of the parts of the trainer's construction (e.g. lowering,
  // upload, capture), for the run's time breakdown; empty if not timed.
  virtual std::vector<std::pair<std::string, double>> setup_phases() const { return {}; }
  // The CUDA backend's fast paths that declined the training graph, each
  // (name, why): `stepgraph train` logs one line per entry (issue 35).
  virtual std::vector<std::pair<std::string, std::string>> declined_fast_paths() const { return {}; }
};

// Throws std::invalid_argument when spec.program does not fit `data`.
std::unique_ptr<Trainer> make_cpu_trainer(const TrainerSpec& spec, const Dataset& data);

}  // namespace sg
