#pragma once
// Shared by the per-group and whole-step tests: the same training steps run
// as replays of a one-step CUDA graph, as plain stream launches, and with
// several steps per graph launch end in the same state, bit for bit.
#include <doctest/doctest.h>

#include <cstdint>

#include "runtime/cuda/cuda_trainer.hpp"
#include "tests/support/training_helpers.hpp"

namespace sg::test {

// `check_replay(replay)` adds the caller's own checks on the replayed trainer.
template <typename Check>
void check_launch_paths_agree(MlpTrainerSpec spec, const Dataset& data, std::int64_t steps, std::int64_t steps_per_graph,
                              Check&& check_replay) {
  cuda::CudaTrainer replay(cuda_spec(spec, data), data);
  spec.cuda_graph = false;
  cuda::CudaTrainer stream(cuda_spec(spec, data), data);
  spec.cuda_graph = true;
  spec.backend.steps_per_launch = steps_per_graph;
  cuda::CudaTrainer unrolled(cuda_spec(spec, data), data);
  replay.train(steps);
  stream.train(steps);
  unrolled.train(steps);
  check_same_state(replay, stream);
  check_same_state(replay, unrolled);
  CHECK(replay.last_loss() == stream.last_loss());
  check_replay(replay);
}

}  // namespace sg::test
