#pragma once
// Maps a TrainConfig to the MLP training setup (models/) and to a
// TrainerSpec whose program is built for the chosen backend, and picks the
// backend: "cuda" needs a GPU, "cpu" never uses one, "auto" falls back to the
// CPU and says so.
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "apps/config/train_config.hpp"
#include "models/mlp_program.hpp"
#include "models/sequential_program.hpp"
#include "runtime/trainer.hpp"

namespace sg::app {

// `feature_dtype`: the dataset's feature table (u8 pixels are scaled by
// 1/255 before data.normalize's mean/std; f16/f32 features are not).
// Throws ConfigError for a model.sequential config.
MlpTraining mlp_training(const TrainConfig& config, DType feature_dtype = DType::u8);
// The Sequential form (model.sequential) with the same data, loss, precision
// and optimizer settings as mlp_training.
SequentialTraining sequential_training(const TrainConfig& config, DType feature_dtype = DType::u8);
// Throws ConfigError when the CUDA backend cannot run the config's model
// (CNN layers have no CUDA lowerings yet, issue 22).
void check_cuda_can_run(const TrainConfig& config);
// Float targets per example (model.layers' last entry) for a regression loss
// (model.loss mse or l1); 0 for class labels.
std::int64_t target_width(const TrainConfig& config);
// The program for splits of `train_rows` / `test_rows` rows, built for `target`,
// with the config's shuffle seed and backend options.
TrainerSpec trainer_spec(const TrainConfig& config, std::int64_t train_rows, std::int64_t test_rows,
                         ProgramTarget target, DType feature_dtype = DType::u8);
bool cuda_backend_usable();  // built with CUDA and a device is present
// Starts the CUDA context (and cuBLASLt) on a worker thread when the config
// may use the GPU (backend.kind auto or cuda, built with CUDA), so it comes up
// while the data loads (runtime/cuda/device_warmup.hpp). make_trainer does
// not need it, but waiting for it first keeps the timing of the two apart.
struct DeviceWarmup {
  bool device = false;  // a device came up (false at once for the CPU backend)
  // Wall seconds of the worker thread's parts: driver initialisation, the
  // primary context, cuBLASLt's first heuristic query.
  std::vector<std::pair<std::string, double>> parts;
};
std::future<DeviceWarmup> start_device_warmup(const TrainConfig& config);
// Destroys the CUDA context of the calling thread's device now, for a
// process that makes no further CUDA calls (runtime/cuda/device_release.hpp);
// nothing in a build without CUDA.
void release_cuda_device() noexcept;
// `note` receives a line to show the user when auto falls back to the CPU.
std::unique_ptr<Trainer> make_trainer(const TrainConfig& config, const Dataset& data, std::string& note);

}  // namespace sg::app
