#pragma once
// Maps a TrainConfig to a TrainerSpec and picks the backend: "cuda" needs a
// GPU, "cpu" never uses one, "auto" falls back to the CPU and says so.
#include <memory>
#include <string>

#include "apps/config/train_config.hpp"
#include "runtime/trainer.hpp"

namespace sg::app {

TrainerSpec trainer_spec(const TrainConfig& config);
bool cuda_backend_usable();  // built with CUDA and a device is present
// `note` receives a line to show the user when auto falls back to the CPU.
std::unique_ptr<Trainer> make_trainer(const TrainConfig& config, const Dataset& data, std::string& note);

}  // namespace sg::app
