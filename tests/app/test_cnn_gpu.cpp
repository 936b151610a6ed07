// Issue 22 on the GPU, through the app: the report's CNN
// (configs/mnist_cnn.yaml, dropout2d and dropout on) trains on CUDA with the
// same losses as the CPU backend; graph replay, stream launches and several
// steps per graph launch end in the same bits; a run resumed from a
// checkpoint ends bit-exactly where a straight run does; and
// configs/mnist_cnn_fast.yaml reaches >= 99% MNIST test accuracy.
#include <doctest/doctest.h>

#include <cmath>

#include "apps/backend_choice.hpp"
#include "apps/config/train_config.hpp"
#include "apps/load_dataset.hpp"
#include "apps/training_run.hpp"
#include "runtime/cuda/cuda_program.hpp"
#include "runtime/cuda/cuda_trainer.hpp"
#include "runtime/io/checkpoint.hpp"
#include "runtime/core_only_switch.hpp"
#include "runtime/tensor_blob.hpp"
#include "tests/runtime/test_support.hpp"
#include "tests/support/checkpoint_checks.hpp"
#include "tests/support/training_helpers.hpp"
#include "tests/support/temp_files.hpp"
#include "tests/support/test_data.hpp"

using namespace sg;
namespace fs = std::filesystem;

namespace {

app::TrainConfig cnn_config(const fs::path &out, std::vector<std::string> extra = {},
                            const std::string &file = "configs/mnist_cnn.yaml") {
  // A test's own backend.kind and run.steps come later and win.
  extra.insert(extra.begin(), {"backend.kind=cuda", "run.steps=20"});
  extra.push_back("data.dir=" + test::mnist_dir_or_skip().string());
  extra.push_back("run.out_dir=" + out.string());
  extra.push_back("data.train_limit=1280");
  extra.push_back("data.test_limit=200");
  extra.push_back("data.eval_batch_size=200");
  extra.push_back("run.epochs=0");
  return app::load_config(test::source_dir() / file, extra);
}

std::unique_ptr<Trainer> trainer(const app::TrainConfig &c, const Dataset &data) {
  std::string note;
  return app::make_trainer(c, data, note);
}

}  // namespace

TEST_CASE("the report's CNN step on CUDA follows the CPU backend: one step's state, twenty steps' losses") {
  const auto out = test::fresh_dir("stepgraph-cnn-gpu-vs-cpu");
  // auto: the fused CNN step (cnn_step); cudnn / implicit_gemm: the per-launch schedule with those convolutions.
  for (const std::string kernels : {"auto", "cudnn", "implicit_gemm"}) {
    CAPTURE(kernels);
    const auto gpu_config = cnn_config(out, {"backend.conv_kernels=" + kernels});
    const auto cpu_config = cnn_config(out, {"backend.kind=cpu"});
    const Dataset data = app::load_dataset(gpu_config);
    const auto gpu = trainer(gpu_config, data);
    const auto cpu = trainer(cpu_config, data);
    REQUIRE(gpu->description().find("cuda") != std::string::npos);
    // (Under --core-only no run takes the cnn_step fast path: the comparison below still holds.)
    CHECK((gpu->description().find("cnn_step") != std::string::npos) == (kernels == "auto" && !core_only_forced_for_tests()));
    // After one step every parameter and velocity (= the first gradient, with
    // dropout2d and dropout drawing the same masks on both backends) agrees to
    // fp16 rounding: the sums differ in order only.
    gpu->train(1);
    cpu->train(1);
    test::check_states_close(*gpu, *cpu, 1e-2);
    // Twenty steps on, fp16 rounding differences have compounded in the
    // velocities, but the losses still follow each other within a percent.
    test::check_losses_follow(*gpu, *cpu, 19, 1e-2);
  }
  fs::remove_all(out);
}

TEST_CASE("the CNN's graph replay, stream launches and 5 steps per graph launch end in the same bits") {
  const auto out = test::fresh_dir("stepgraph-cnn-launch-paths");
  // auto: the fused CNN step; cudnn, implicit_gemm: per-launch convolutions by cuDNN or by ours.
  for (const std::string kernels : {"auto", "cudnn", "implicit_gemm"}) {
    CAPTURE(kernels);
    const std::string choice = "backend.conv_kernels=" + kernels;
    const auto replay_config = cnn_config(out, {choice});
    const Dataset data = app::load_dataset(replay_config);
    const auto replay = trainer(replay_config, data);
    const auto stream = trainer(cnn_config(out, {choice, "backend.cuda_graph=false"}), data);
    const auto unrolled = trainer(cnn_config(out, {choice, "backend.steps_per_launch=5"}), data);
    replay->train(15);
    stream->train(15);
    unrolled->train(15);
    const auto a = replay->save_state();
    test::check_same_state(a, stream->save_state());
    test::check_same_state(a, unrolled->save_state());
    CHECK(replay->last_loss() == stream->last_loss());
  }
  fs::remove_all(out);
}

TEST_CASE("the second stream changes no bits: mnist_cnn_fast and the report CNN (SGD, RMSprop), replayed and "
          "streamed, on one or two gradient streams") {
  const auto out = test::fresh_dir("stepgraph-cnn-gradient-stream");
  int two_lanes = 0;  // cases whose plan uses both gradient streams
  const std::vector<std::string> all_off = {"backend.weight_gradient_stream=false",
                                            "backend.independent_launch_stream=false"};
  struct Case {
    std::string file;
    std::vector<std::string> sets;
  };
  // Per-launch schedules (the fused CNN step is one launch): cuDNN's convolutions or ours.
  for (const Case& c : {Case{"configs/mnist_cnn_fast.yaml", {}}, Case{"configs/mnist_cnn.yaml", {}},
                        Case{"configs/mnist_cnn.yaml", {"optim.name=rmsprop", "optim.lr=0.001"}}})
    for (const std::string kernels : {"cudnn", "implicit_gemm"}) {
      CAPTURE(c.file);
      CAPTURE(c.sets.size());
      CAPTURE(kernels);
      const auto config = [&](std::vector<std::string> extra) {
        extra.insert(extra.end(), c.sets.begin(), c.sets.end());
        extra.push_back("backend.conv_kernels=" + kernels);
        return cnn_config(out, extra, c.file);
      };
      const auto on_config = config({});
      const Dataset data = app::load_dataset(on_config);
      const auto on = trainer(on_config, data);
      const auto off = trainer(config(all_off), data);
      const auto streamed = trainer(config({"backend.cuda_graph=false"}), data);
      const auto alone = trainer(config({"backend.independent_launch_stream=false"}), data);
      const auto one_lane = trainer(config({"backend.gradient_streams=1"}), data);
      const auto *gpu = dynamic_cast<const cuda::CudaTrainer *>(on.get());
      const auto *plain = dynamic_cast<const cuda::CudaTrainer *>(off.get());
      REQUIRE(gpu != nullptr);
      REQUIRE(plain != nullptr);
      CHECK(gpu->training_program().stream_plan().splits_gradients());
      CHECK_FALSE(plain->training_program().stream_plan().splits_gradients());
      two_lanes += gpu->training_program().stream_plan().gradient_lanes() == 2 ? 1 : 0;
      for (Trainer *t : {on.get(), off.get(), streamed.get(), alone.get(), one_lane.get()}) t->train(15);
      const auto a = on->save_state();
      test::check_same_state(a, off->save_state());
      test::check_same_state(a, streamed->save_state());
      test::check_same_state(a, alone->save_state());
      test::check_same_state(a, one_lane->save_state());
      CHECK(on->last_loss() == off->last_loss());
    }
  CHECK(two_lanes >= 1);  // mnist_cnn_fast on cuDNN: its second layer's column sums beside the weight gradient
  fs::remove_all(out);
}

TEST_CASE("a CNN run on CUDA resumes bit-exactly: 20 steps == 10 + resume + 10") {
  const auto out = test::fresh_dir("stepgraph-cnn-gpu-resume");
  app::run_training(cnn_config(out / "a", {"run.steps=20", "run.checkpoint=" + (out / "a.sgck").string()}));
  app::run_training(cnn_config(out / "b", {"run.steps=10", "run.checkpoint=" + (out / "b.sgck").string()}));
  app::run_training(cnn_config(out / "c", {"run.steps=20", "run.resume=" + (out / "b.sgck").string(),
                                           "run.checkpoint=" + (out / "c.sgck").string()}));
  test::check_same_checkpoints(out / "a.sgck", out / "c.sgck", 20);
  fs::remove_all(out);
}

TEST_CASE("configs/mnist_cnn_fast.yaml reaches at least 99.0% MNIST test accuracy") {
  const auto out = test::fresh_dir("stepgraph-cnn-fast");
  const auto config =
      app::load_config(test::source_dir() / "configs/mnist_cnn_fast.yaml",
                       {"data.dir=" + test::mnist_dir_or_skip().string(), "run.out_dir=" + out.string(), "backend.kind=cuda"});
  const auto summary = app::run_training(config);
  MESSAGE("mnist_cnn_fast: " << summary.steps << " steps in " << summary.seconds << " s, test accuracy "
                             << 100 * summary.final_eval.accuracy << "% on " << summary.backend);
  CHECK(summary.final_eval.examples == 10000);
  CHECK(summary.final_eval.accuracy >= 0.99);
  fs::remove_all(out);
}
