#pragma once
// Maps a TrainConfig to the MLP training setup (models/) and to a
// TrainerSpec whose program is built for the chosen backend, and picks the
// backend: "cuda" needs a GPU, "cpu" never uses one, "auto" falls back to the
// CPU and says so.
#include <cstdint>
#include <memory>
#include <string>

#include "apps/config/train_config.hpp"
#include "models/mlp_program.hpp"
#include "runtime/trainer.hpp"

namespace sg::app {

MlpTraining mlp_training(const TrainConfig& config);
// The program for splits of `train_rows` / `test_rows` rows, built for `target`,
// with the config's shuffle seed and backend options.
TrainerSpec trainer_spec(const TrainConfig& config, std::int64_t train_rows, std::int64_t test_rows,
                         ProgramTarget target);
bool cuda_backend_usable();  // built with CUDA and a device is present
// `note` receives a line to show the user when auto falls back to the CPU.
std::unique_ptr<Trainer> make_trainer(const TrainConfig& config, const Dataset& data, std::string& note);

}  // namespace sg::app
