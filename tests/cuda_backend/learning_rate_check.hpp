#pragma once
// Shared by the per-group and whole-step tests: learning-rate changes between
// replays (0.05, 0.2, 0.01 for 10 steps each) reach the captured step. The GPU
// follows the CPU backend doing the same, and ends away from a run that kept
// the first rate, so the changes had an effect.
#include <doctest/doctest.h>

#include "runtime/cuda/cuda_program.hpp"
#include "runtime/cuda/cuda_trainer.hpp"
#include "tests/runtime/test_support.hpp"
#include "tests/support/training_helpers.hpp"

namespace sg::test {

inline void check_learning_rate_changes_reach(const MlpTrainerSpec& spec, const Dataset& data, bool whole_step) {
  auto cpu = make_cpu_trainer(cpu_spec(spec, data), data);
  cuda::CudaTrainer gpu(cuda_spec(spec, data), data);
  REQUIRE(gpu.training_program().uses_whole_step() == whole_step);
  for (double lr : {0.05, 0.2, 0.01}) {
    cpu->set_learning_rate(lr);
    gpu.set_learning_rate(lr);
    cpu->train(10);
    gpu.train(10);
  }
  CHECK(relative_error(all_parameters(gpu), all_parameters(*cpu)) < 2e-2);
  cuda::CudaTrainer constant(cuda_spec(spec, data), data);
  constant.train(30);
  CHECK(relative_error(all_parameters(constant), all_parameters(gpu)) > 1e-3);
}

}  // namespace sg::test
