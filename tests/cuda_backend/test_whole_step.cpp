// The whole-step kernel (one cooperative kernel per training step) against
// the CPU backend on random shapes, against the per-group cuBLASLt schedule
// on the reference network, and its fallbacks, replay/stream identity and
// learning-rate changes.
#include <doctest/doctest.h>

#include <array>
#include <numeric>
#include <cstdlib>

#include "runtime/cuda/cuda_program.hpp"
#include "runtime/cuda/cuda_trainer.hpp"
#include "tests/runtime/test_support.hpp"
#include "runtime/data/idx_reader.hpp"
#include "tests/support/test_data.hpp"
#include "tests/cuda_backend/learning_rate_check.hpp"
#include "tests/support/training_helpers.hpp"

using namespace sg;
using sg::test::all_parameters;
using sg::test::losses;
using sg::test::random_dataset;

namespace {

TrainerSpec f16_spec(std::vector<std::int64_t> layers, std::int64_t batch, double weight_decay = 0.0) {
  TrainerSpec spec;
  spec.mlp.layers = std::move(layers);
  spec.mlp.batch = batch;
  spec.mlp.weight_dtype = DType::f16;
  spec.sgd = {0.05, 0.0, weight_decay};
  spec.eval_batch = 100;
  spec.init_seed = 7;
  spec.shuffle_seed = 9;
  return spec;
}

}  // namespace

// Runs `body` once with the kernel as one thread-block cluster and once as a
// cooperative grid (the two ways it is launched).
template <typename Body>
void in_both_launch_modes(Body&& body) {
  for (const char* mode : {"cluster", "grid"}) {
    ::setenv("SG_WHOLE_STEP_MODE", mode, 1);
    INFO("launch mode " << mode);
    body(std::string(mode));
  }
  ::unsetenv("SG_WHOLE_STEP_MODE");
}

TEST_CASE("the whole-step kernel follows the CPU backend on random shapes") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  in_both_launch_modes([&](const std::string& mode) {
  struct Case {
    std::vector<std::int64_t> layers;
    std::int64_t batch;
    double weight_decay;
  };
  for (const Case& c : std::vector<Case>{{{48, 64, 32, 10}, 32, 0.0},
                                         {{32, 16, 7}, 16, 1e-3},
                                         {{64, 10}, 64, 0.0},
                                         {{112, 96, 80, 48, 29}, 48, 0.0}}) {
    const TrainerSpec spec = f16_spec(c.layers, c.batch, c.weight_decay);
    INFO("layers " << c.layers.size() << " first width " << c.layers[0] << " batch " << c.batch);
    const Dataset data = random_dataset(c.batch * 12 + 5, c.layers.front(), c.layers.back(), rng);  // reshuffles happen
    auto cpu = make_cpu_trainer(spec, data);
    cuda::CudaTrainer gpu(spec, data);
    REQUIRE(gpu.training_program().uses_whole_step());
    CHECK(gpu.training_program().schedule().launches.size() == 1);
    gpu.poison_activations();  // scratch the kernel forgot to write would show as NaN
    const auto first_gpu = losses(gpu, 1), first_cpu = losses(*cpu, 1);
    CHECK(std::abs(first_gpu[0] - first_cpu[0]) / first_cpu[0] < 2e-3);
    CHECK(sg::test::relative_error(all_parameters(gpu), all_parameters(*cpu)) < 2e-3);
    const auto gpu_curve = losses(gpu, 99), cpu_curve = losses(*cpu, 99);
    MESSAGE("step 100 loss gpu " << gpu_curve.back() << " cpu " << cpu_curve.back());
    CHECK(sg::test::relative_error(gpu_curve, cpu_curve) < 1e-2);
    CHECK(sg::test::relative_error(all_parameters(gpu), all_parameters(*cpu)) < 5e-2);
    CHECK(gpu.step() == 100);
    CHECK(gpu.description().find(mode == "cluster" ? "one cluster" : "cooperative grid") != std::string::npos);
  }
  });
}

TEST_CASE("on the reference network and real MNIST the whole-step kernel follows the per-group schedule") {
  const Dataset data{data::load_split(sg::test::mnist_dir(), "train", 4000), data::load_split(sg::test::mnist_dir(), "t10k", 500)};
  TrainerSpec spec = f16_spec({784, 128, 128, 128, 10}, 32);
  spec.sgd.lr = 0.1;
  cuda::CudaTrainer whole(spec, data);
  spec.whole_step = false;
  spec.one_pass_backward = false;
  cuda::CudaTrainer grouped(spec, data);
  REQUIRE(whole.training_program().uses_whole_step());
  REQUIRE(grouped.training_program().schedule().launches.size() == 17);
  const auto a = losses(whole, 200), b = losses(grouped, 200);
  MESSAGE("step 200 loss whole-step " << a.back() << " per-group " << b.back());
  CHECK(sg::test::relative_error(a, b) < 1e-2);
  CHECK(sg::test::relative_error(all_parameters(whole), all_parameters(grouped)) < 2e-2);
  // It learns: real digits, so the mean loss of the last 20 steps is well
  // below that of the first 20 (single-batch losses are noisy).
  const auto mean20 = [](auto first) { return std::accumulate(first, first + 20, 0.0) / 20; };
  CHECK(mean20(a.end() - 20) < 0.85 * mean20(a.begin()));
}

TEST_CASE("shapes the whole-step kernel does not take fall back to the per-group schedule, saying why") {
  auto rng = sg::test::fresh_rng();
  const Dataset data = random_dataset(400, 48, 10, rng);
  struct Case {
    TrainerSpec spec;
    const char* reason;
  };
  TrainerSpec odd_width = f16_spec({48, 40, 10}, 32);
  TrainerSpec odd_batch = f16_spec({48, 32, 10}, 24);
  TrainerSpec momentum = f16_spec({48, 32, 10}, 32);
  momentum.sgd.momentum = 0.9;
  TrainerSpec master = f16_spec({48, 32, 10}, 32);
  master.mlp.weight_dtype = DType::f32;
  TrainerSpec off = f16_spec({48, 32, 10}, 32);
  off.whole_step = false;
  TrainerSpec wide = f16_spec({48, 1024, 1024, 10}, 32);  // 1.1M parameters
  for (const Case& c : {Case{odd_width, "multiple of 16"}, Case{odd_batch, "batch 24"}, Case{momentum, "momentum"},
                        Case{master, "not a plain MLP training step"},  // casts to fp32 master weights
                        Case{off, "turned off"}, Case{wide, "parameters"}}) {
    cuda::CudaTrainer t(c.spec, data);
    INFO(t.description());
    CHECK_FALSE(t.training_program().uses_whole_step());
    CHECK(t.training_program().whole_step_note().find(c.reason) != std::string::npos);
    CHECK(t.training_program().schedule().launches.size() > 1);
    t.train(3);
    CHECK(std::isfinite(t.last_loss()));
  }
}

TEST_CASE("whole-step: replay, stream launches and K steps per graph are bit-identical") {
  in_both_launch_modes([&](const std::string&) {
  auto rng = sg::test::fresh_rng();
  const Dataset data = random_dataset(500, 64, 10, rng);
  TrainerSpec spec = f16_spec({64, 96, 48, 10}, 32);
  cuda::CudaTrainer replay(spec, data);
  spec.cuda_graph = false;
  cuda::CudaTrainer stream(spec, data);
  spec.cuda_graph = true;
  spec.steps_per_launch = 4;
  cuda::CudaTrainer unrolled(spec, data);
  REQUIRE(replay.training_program().uses_whole_step());
  replay.train(37);
  stream.train(37);
  unrolled.train(37);
  sg::test::check_same_state(replay, stream);
  sg::test::check_same_state(replay, unrolled);
  CHECK(replay.last_loss() == stream.last_loss());
  });
}

TEST_CASE("whole-step: the phase profile names every phase and takes real time") {
  auto rng = sg::test::fresh_rng();
  const Dataset data = random_dataset(500, 64, 10, rng);
  cuda::CudaTrainer t(f16_spec({64, 96, 48, 10}, 32), data);
  const auto phases = t.profile_step(3);
  REQUIRE(phases.size() == 5);  // 2 hidden forwards, logits + softmax, 2 backward phases
  CHECK(phases.front().label == "whole_step: fetch + layer 1 forward");
  CHECK(phases.back().label == "whole_step: layer 2 SGD + layer 1 SGD");
  for (const auto& p : phases) {
    INFO(p.label);
    CHECK(p.ms > 0);
    CHECK(p.ms < 10);
  }
  CHECK(t.step() == 3);
}

TEST_CASE("whole-step: a learning-rate change reaches the replayed kernel") {
  auto rng = sg::test::fresh_rng();
  sg::test::check_learning_rate_changes_reach(f16_spec({64, 32, 10}, 16), random_dataset(500, 64, 10, rng), true);
}
