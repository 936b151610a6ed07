#pragma once
// What the training app drives, whatever the backend: run steps, read the
// loss, evaluate, change the learning rate, save and restore state.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "graph/fusion_pass.hpp"
#include "graph/mlp_builder.hpp"
#include "graph/optimizer_pass.hpp"
#include "runtime/data/idx_reader.hpp"
#include "runtime/io/checkpoint.hpp"

namespace sg {

struct TrainerSpec {
  MlpSpec mlp;                 // dataset_rows is filled from the training split
  SgdSpec sgd;
  FusionOptions fusion;
  std::int64_t eval_batch = 1000;  // rounded down to a divisor of the test rows
  std::uint64_t init_seed = 0;
  std::uint64_t shuffle_seed = 1;
  // CUDA backend only
  bool accumulate_f16 = false;
  bool cuda_graph = true;
  bool autotune = false;
  bool whole_step = true;  // one kernel per step where the MLP fits it
  bool one_pass_backward = true;  // dgrad + SGD in one pass over each weight, and the output layer's backward in one kernel, where they fit
  std::int64_t steps_per_launch = 1;
};

struct Dataset {
  data::Split train;
  data::Split test;
};

struct EvalResult {
  double loss = 0;
  double accuracy = 0;
  std::int64_t examples = 0;
};

class Trainer {
 public:
  virtual ~Trainer() = default;
  virtual std::string description() const = 0;
  virtual void train(std::int64_t steps) = 0;
  virtual double last_loss() = 0;  // loss of the most recent step
  virtual EvalResult evaluate() = 0;
  virtual void set_learning_rate(double lr) = 0;
  // Parameters, then velocities, then the step counter (as i32 [1] "step").
  virtual std::vector<io::TensorBlob> save_state() = 0;
  virtual void load_state(const std::vector<io::TensorBlob>& blobs) = 0;
  virtual std::int64_t step() const = 0;
};

std::unique_ptr<Trainer> make_cpu_trainer(const TrainerSpec& spec, const Dataset& data);

// Largest divisor of `rows` not above `wanted` (eval batches cover the test set exactly).
std::int64_t eval_batch_for(std::int64_t rows, std::int64_t wanted);

}  // namespace sg
