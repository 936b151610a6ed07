// backend.activation_layout: auto with backend.autotune (runtime/cuda/
// timed_layout_choice.hpp) on the GPU: the trainer times both forms of the
// step and says so; the timing's steps are undone bit for bit (parameters,
// optimizer state, step, loss watch), so training afterwards gives the bits a
// trainer that was never timed gives; and the kept form trains as that form
// does when set in the config. Without autotune, or with a layout set,
// nothing is timed.
#include <doctest/doctest.h>

#include <random>
#include <string>

#include "models/sequential_program.hpp"
#include "runtime/cuda/cuda_trainer.hpp"
#include "runtime/cuda/timed_layout_choice.hpp"
#include "runtime/tensor_blob.hpp"
#include "tests/runtime/channels_last_networks.hpp"
#include "tests/runtime/test_support.hpp"
#include "tests/support/training_helpers.hpp"

using namespace sg;

namespace {

// A 1 -> 6 -> 16 CNN with dropout2d (LeNet-like: its 6-filter layer on the
// few-channel kernels channels-last), AdamW with fp32 master weights, batch 32.
SequentialTraining lenet_like() {
  SequentialTraining t;
  t.model.input_shape = {1, 28, 28};
  t.model.layers = {test::net_layer(LayerKind::conv2d, 6, 5, 2),  test::net_layer(LayerKind::activation),
                    test::net_layer(LayerKind::max_pool2d, 0, 2), test::net_layer(LayerKind::dropout2d),
                    test::net_layer(LayerKind::conv2d, 16, 5, 0), test::net_layer(LayerKind::activation),
                    test::net_layer(LayerKind::max_pool2d, 0, 2), test::net_layer(LayerKind::flatten),
                    test::net_layer(LayerKind::linear, 10)};
  t.model.layers[3].p = 0.2;
  t.model.batch = 32;
  t.model.weight_dtype = DType::f32;
  t.optimizer.kind = OptimizerKind::adamw;
  t.optimizer.lr = 2e-3;
  t.optimizer.weight_decay = 0.01;
  t.eval_batch = 40;
  t.init_seed = 4;
  return t;
}

TrainerSpec spec_for(const SequentialTraining& t, const Dataset& data, ActivationLayout layout, bool autotune) {
  TrainerSpec spec;
  spec.program = build_sequential_program(t, data.train.images.count, data.test.images.count, ProgramTarget::cuda);
  spec.backend.activation_layout = layout;
  spec.backend.autotune = autotune;
  return spec;
}

Dataset images(const SequentialTraining& t) {
  std::mt19937_64 rng(61);
  return test::random_dataset(t.model.batch * 7, 28 * 28, 10, rng);
}

}  // namespace

TEST_CASE("a timing of the step is undone bit for bit: training then gives the bits of an untimed trainer") {
  const SequentialTraining t = lenet_like();
  const Dataset data = images(t);
  for (const ActivationLayout layout : {ActivationLayout::nchw, ActivationLayout::channels_last}) {
    for (const bool replay : {true, false}) {
      INFO(activation_layout_name(layout), replay ? ", graph replay" : ", stream launches");
      // Without autotune both trainers take cuDNN's heuristic engines: the same bits step by step.
      TrainerSpec spec = spec_for(t, data, layout, false);
      spec.cuda_graph = replay;
      cuda::CudaTrainer timed(spec, data), untimed(spec, data);
      const auto before = timed.save_state();
      const double us = cuda::timed_step_us(timed, replay);
      CHECK(us > 0);
      CHECK(timed.step() == 0);
      test::check_same_state(before, timed.save_state());
      // Across an epoch's end (7 batches a permutation): the same losses and states, bit for bit.
      CHECK(test::losses(timed, 9) == test::losses(untimed, 9));
      test::check_same_state(timed, untimed);
      CHECK(timed.first_nonfinite_step() == -1);
    }
  }
}

TEST_CASE("auto with autotune times both layouts at start-up and keeps one that trains like it") {
  const SequentialTraining t = lenet_like();
  const Dataset data = images(t);
  cuda::CudaTrainer timed(spec_for(t, data, ActivationLayout::automatic, true), data);
  const std::string description = timed.description();
  INFO(description);
  CHECK(description.find("(timed at start-up, backend.autotune: ") != std::string::npos);
  const bool channels_last = description.find("channels-last (timed at start-up") != std::string::npos;
  CHECK((channels_last || description.find("NCHW (timed at start-up") != std::string::npos));
  bool phase = false;
  for (const auto& [part, seconds] : timed.setup_phases())
    phase = phase || (part.find("timing the other activation layout") != std::string::npos && seconds > 0);
  CHECK(phase);
  // The kept form from its initial state: the same parameters as a trainer of that form built alone, and
  // losses within the two builds' engine choices (autotune times cuDNN's engines in each).
  cuda::CudaTrainer alone(
      spec_for(t, data, channels_last ? ActivationLayout::channels_last : ActivationLayout::nchw, true), data);
  CHECK(timed.step() == 0);
  test::check_same_state(timed, alone);
  test::check_losses_follow(timed, alone, 6, 2e-2);
}

TEST_CASE("nothing is timed with a layout set, without autotune, or in data parallel") {
  const SequentialTraining t = lenet_like();
  const Dataset data = images(t);
  CHECK(cuda::layout_timing_skipped(spec_for(t, data, ActivationLayout::automatic, true)) == "");
  CHECK(cuda::layout_timing_skipped(spec_for(t, data, ActivationLayout::nchw, true)) == "the layout is set");
  CHECK(cuda::layout_timing_skipped(spec_for(t, data, ActivationLayout::automatic, false)) ==
        "backend.autotune is off");
  TrainerSpec ranks = spec_for(t, data, ActivationLayout::automatic, true);
  ranks.data_parallel.world_size = 2;
  CHECK(cuda::layout_timing_skipped(ranks) == "data parallel");
  const std::string rule = cuda::CudaTrainer(spec_for(t, data, ActivationLayout::automatic, false), data).description();
  CHECK(rule.find("timed at start-up") == std::string::npos);
}
