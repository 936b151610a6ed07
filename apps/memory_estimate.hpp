#pragma once
// What a training run will hold in memory, estimated before the big
// allocations: the graphs the run will execute are built (shapes only, no
// tensor behind them) and their values summed by role, so the count holds for
// any model the builders make (model.layers MLPs, model.sequential CNNs).
//
// Counted, on the CPU backend (host only; it allocates every value of both
// graphs, floats as f32): the training graph's values (parameters, gradients,
// optimizer state, activations of one batch, the training split's tables),
// the eval graph's values (its own copy of the parameters, activations of one
// eval batch, the test split's tables), the f32 initial parameters, and the
// loaded dataset. On the CUDA backend: on the device, the training graph's
// values in their dtypes and the eval graph's besides the parameters (shared),
// activations and gradients without the arena's reuse (an upper bound); on the
// host, the loaded dataset and two f32 copies of the initial parameters (the
// program's and the trainer's). Not counted: the CUDA context, cuBLASLt and
// cuDNN workspaces, the process's code and the allocator's slack.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "apps/config/train_config.hpp"
#include "graph/dtype.hpp"
#include "runtime/trainer.hpp"

namespace sg::app {

// Bytes by what they hold.
struct MemoryParts {
  double parameters = 0;          // weights and biases (the CPU backend's eval graph holds a second copy)
  double gradients = 0;
  double optimizer_state = 0;     // momentum, Adam moments, the step counters
  double activations = 0;         // one training batch and one eval batch, forward and backward
  double dataset = 0;             // feature tables, labels or targets, row permutations
  double initial_parameters = 0;  // host: the f32 initial values the trainer is built from
  double total() const;
  std::string describe() const;   // "parameters 3.1 GB, gradients 3.1 GB, ..." (the parts above 0)
};

struct MemoryNeed {
  MemoryParts host;
  MemoryParts device;  // all zero on the CPU backend
};

// The rows the graphs are built for and the bytes of the loaded Dataset.
struct DataShape {
  std::int64_t train_rows = 0;
  std::int64_t test_rows = 0;
  DType feature_dtype = DType::u8;
  double loaded_bytes = 0;
};
// Before the data is read: tables of one batch (the model alone).
DataShape data_shape_before_loading(const TrainConfig& config);
DataShape data_shape_of(const Dataset& data);

// Throws what the model builders throw for a config they cannot build (GraphError).
MemoryNeed estimate_run_memory(const TrainConfig& config, const DataShape& data, bool on_cuda);

struct MemoryAvailable {
  std::optional<double> host;    // bytes a new allocation may take (nullopt: unknown, not checked)
  std::string host_source;       // "MemAvailable", "the cgroup's memory.max", ...
  std::optional<double> device;  // free bytes on the current GPU (cudaMemGetInfo)
};
// MemAvailable from /proc/meminfo, lowered to a cgroup's limit left when one
// is set; sysconf's available pages where /proc is unreadable.
MemoryAvailable available_memory(bool on_cuda);

// Throws ConfigError naming the model's key (model.layers or
// model.sequential) with the needed and available GB when the need exceeds
// what is available; returns a warning line for each memory (host, GPU)
// whose need exceeds half of what is available. `already_held`: bytes of the
// host need allocated already (the loaded dataset), so not in
// `available.host` any more.
std::vector<std::string> check_memory_fits(const TrainConfig& config, const MemoryNeed& need,
                                           const MemoryAvailable& available, double already_held = 0);

}  // namespace sg::app
