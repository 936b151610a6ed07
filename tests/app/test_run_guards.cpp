// A run's guards (issue 34), in process, on configs/regression_mse.yaml's CSV
// and tiny synthetic .npy images (no MNIST): the out_dir lock, no out_dir
// left by a failed start-up, the memory estimate counted from the graphs and
// its refusal, plausible config sizes, the capped config echo, a cancellable
// evaluation, a relative run.checkpoint under run.out_dir, and the resume
// messages. tests/scripts/test_run_guards.sh runs the binary (signals, timing).
#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "apps/backend_choice.hpp"
#include "apps/config/plausible_sizes.hpp"
#include "apps/config/train_config.hpp"
#include "apps/load_dataset.hpp"
#include "apps/memory_estimate.hpp"
#include "apps/run_lock.hpp"
#include "apps/training_run.hpp"
#include "models/mlp_program.hpp"
#include "runtime/io/checkpoint.hpp"
#include "tests/support/npy_files.hpp"
#include "tests/support/temp_files.hpp"
#include "tests/support/error_text.hpp"
#include "tests/support/log_capture.hpp"
#include "tests/support/test_data.hpp"

using namespace sg;
namespace fs = std::filesystem;

using sg::test::error_of;
using sg::test::logged;

namespace {

// configs/regression_mse.yaml, small and on the CPU, reading the shipped CSV.
app::TrainConfig regression_config(const fs::path& out, std::vector<std::string> extra = {}) {
  extra.insert(extra.begin(), {"data.train_x=" + (test::source_dir() / "configs/data/inr_pattern.csv").string(),
                               "run.out_dir=" + out.string(), "backend.kind=cpu", "model.layers=[2, 16, 2]",
                               "run.steps=20", "run.log_every=10", "run.eval_every=0"});
  return app::load_config(test::source_dir() / "configs/regression_mse.yaml", extra);
}

// 64 random 4x4 u8 "images" with labels 0..2, as x.npy / y.npy in `dir`.
void write_tiny_images(const fs::path& dir) {
  std::mt19937 rng(3);
  std::vector<std::uint8_t> x(64 * 16), y(64);
  for (auto& v : x) v = static_cast<std::uint8_t>(rng());
  for (auto& v : y) v = static_cast<std::uint8_t>(rng() % 3);
  test::write_file(dir / "x.npy", test::npy_u8({64, 16}, x));
  test::write_file(dir / "y.npy", test::npy_u8({64}, y));
}

std::string image_yaml(const fs::path& data, const fs::path& out, const std::string& model) {
  return model + "data: {train_x: " + (data / "x.npy").string() + ", train_y: " + (data / "y.npy").string() +
         ", test_fraction: 0.25, batch_size: 8, eval_batch_size: 16}\n"
         "optim: {lr: 0.05}\nprecision: {weights: fp32}\n"
         "run: {steps: 6, log_every: 3, out_dir: " + out.string() + ", checkpoint: " + (out / "c.sgck").string() +
         "}\nbackend: {kind: cpu}\n";
}
const std::string kCnn = "model:\n  input: [1, 4, 4]\n  sequential:\n    - conv2d: {out: 2, kernel: 3}\n    - relu\n"
                         "    - flatten\n    - linear: {out: 3}\n";
const std::string kMlp = "model: {layers: [16, 8, 3]}\n";

}  // namespace

TEST_CASE("a second run into a locked out_dir is refused naming the folder and the pid, and writes nothing") {
  const auto out = test::fresh_dir("lock");
  {
    const app::RunLock other(out);  // another run (this process stands in for it)
    const auto error = error_of([&] { app::run_training(regression_config(out)); });
    CHECK(error.find("run.out_dir " + out.string() + ": another stepgraph train (pid " + std::to_string(::getpid()) +
                     ")") != std::string::npos);
    CHECK_FALSE(fs::exists(out / "config.yaml"));
    CHECK_FALSE(fs::exists(out / "metrics.csv"));
  }
  // Released: the next run trains, and leaves no lock file behind.
  app::run_training(regression_config(out));
  CHECK(fs::exists(out / "metrics.csv"));
  CHECK_FALSE(fs::exists(out / app::RunLock::kFileName));
  fs::remove_all(out);
}

TEST_CASE("a start-up that fails on the data leaves no out_dir and no config.yaml behind") {
  const auto dir = test::fresh_dir("no-out-dir");
  // The CSV has 2 features: model.layers[0] = 3 does not fit them.
  const auto error = error_of([&] { app::run_training(regression_config(dir / "a" / "b", {"model.layers=[3, 16, 2]"})); });
  CHECK(error.find("model.layers[0]") != std::string::npos);
  CHECK_FALSE(fs::exists(dir / "a"));
  // An out_dir that was there stays, without a config.yaml.
  fs::create_directories(dir / "kept");
  CHECK_THROWS(app::run_training(regression_config(dir / "kept", {"model.layers=[3, 16, 2]"})));
  CHECK(fs::is_directory(dir / "kept"));
  CHECK(fs::is_empty(dir / "kept"));
  fs::remove_all(dir);
}

TEST_CASE("the memory estimate counts the graphs' values: an MLP and a CNN, CPU and CUDA storage") {
  const auto out = test::fresh_dir("estimate");
  const app::DataShape shape{1000, 500, DType::u8, 12345};
  SUBCASE("an MLP [2, 16, 2] with momentum") {
    const auto config = regression_config(out, {"optim.momentum=0.9"});  // precision.weights fp32
    const double params = (2 * 16 + 16) + (16 * 2 + 2);
    const auto cpu = app::estimate_run_memory(config, shape, false);
    CHECK(cpu.host.parameters == doctest::Approx(2 * params * 4));   // the training and the eval graph's copies
    CHECK(cpu.host.initial_parameters == doctest::Approx(params * 4));
    CHECK(cpu.host.gradients >= params * 4);
    CHECK(cpu.host.optimizer_state >= params * 4);                 // the velocities
    CHECK(cpu.host.dataset >= 12345 + 1000 * 2 * 4);               // the loaded data, the training targets (f32)
    CHECK(cpu.device.total() == 0);
    const auto cuda = app::estimate_run_memory(config, shape, true);
    CHECK(cuda.device.parameters == doctest::Approx(params * 4));  // shared by the training and eval programs
    CHECK(cuda.host.initial_parameters == doctest::Approx(2 * params * 4));
    CHECK(cuda.host.dataset == doctest::Approx(12345));
  }
  SUBCASE("a CNN: conv2d 1->2 channels, kernel 3, on [1, 4, 4], then linear 8 -> 3") {
    const auto c = app::parse_config(image_yaml(out, out, kCnn), "cnn.yaml");
    const double params = (2 * 1 * 3 * 3 + 2) + (2 * 2 * 2 * 3 + 3);
    const auto cpu = app::estimate_run_memory(c, {48, 16, DType::u8, 0}, false);
    CHECK(cpu.host.parameters == doctest::Approx(2 * params * 4));
    CHECK(cpu.host.activations > 0);
    const auto cuda = app::estimate_run_memory(c, {48, 16, DType::u8, 0}, true);
    CHECK(cuda.device.parameters == doctest::Approx(params * 4));  // precision.weights: fp32
  }
  SUBCASE("activations grow with data.batch_size") {
    const auto small = app::estimate_run_memory(regression_config(out, {"data.batch_size=8"}), shape, false);
    const auto large = app::estimate_run_memory(regression_config(out, {"data.batch_size=512"}), shape, false);
    CHECK(large.host.activations > small.host.activations);
  }
  fs::remove_all(out);
}

TEST_CASE("a run that does not fit is refused naming the key and the GB, and above half is a warning") {
  const auto out = test::fresh_dir("fit");
  const auto config = regression_config(out);
  app::MemoryNeed need;
  need.host.parameters = 6e9;
  need.host.gradients = 2e9;
  app::MemoryAvailable available;
  available.host = 4e9;
  available.host_source = "MemAvailable";
  const auto error = error_of([&] { app::check_memory_fits(config, need, available); });
  CHECK(error.find("model.layers [2, 16, 2]: the run needs about 8.0 GB of host memory (parameters 6.0 GB, gradients "
                   "2.0 GB) but 4.0 GB is available (MemAvailable): use a smaller model") != std::string::npos);
  available.host = 12e9;
  const auto warnings = app::check_memory_fits(config, need, available);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("more than half of the 12 GB available") != std::string::npos);
  available.host = 20e9;
  CHECK(app::check_memory_fits(config, need, available).empty());
  available.device = 1e9;  // the GPU: its own check
  need.device.activations = 3e9;
  CHECK(error_of([&] { app::check_memory_fits(config, need, available); }).find("of GPU memory") != std::string::npos);
  fs::remove_all(out);
}

TEST_CASE("a model of 100 million hidden units is refused before anything is allocated, not with std::bad_alloc") {
  const auto out = test::fresh_dir("too-big");
  const auto error = error_of(
      [&] { app::run_training(regression_config(out / "run", {"model.layers=[2, 100000000, 100000000, 2]"})); });
  CHECK(error.find("model.layers [2, 100000000, 100000000, 2]: the run needs about") != std::string::npos);
  CHECK(error.find("GB is available") != std::string::npos);
  CHECK_FALSE(fs::exists(out / "run"));
  fs::remove_all(out);
}

TEST_CASE("implausible sizes are one error naming the key") {
  const std::string tail = "run: {steps: 1}\n";
  const auto error = [&](const std::string& yaml, const std::vector<std::string>& overrides = {}) {
    return error_of([&] { app::parse_config(yaml + tail, "big.yaml", overrides); });
  };
  std::string layers = "model:\n  layers: [784";
  for (int i = 0; i < 5000; ++i) layers += ", 8";
  CHECK(error(layers + ", 10]\n").find("big.yaml:2: model.layers: has 5002 entries; at most 1024") != std::string::npos);
  CHECK(error("model: {layers: [784, 300000000, 10]}\n").find("model.layers: entry 1 (300000000) is wider than") !=
        std::string::npos);
  CHECK(error("model: {hidden_width: 8, hidden_depth: 100000000}\n").find("model.hidden_depth: 100000000 hidden layers") !=
        std::string::npos);
  CHECK(error("model: {layers: [784, 10, 10]}\n", {"data.batch_size=100000000"}).find("data.batch_size") !=
        std::string::npos);
  std::string sequential = "model:\n  input: [8]\n  sequential:\n";
  for (int i = 0; i < 1100; ++i) sequential += "    - relu\n";
  sequential += "    - linear: {out: 2}\n";
  CHECK(error(sequential).find("model.sequential: has 1101 layers; at most 1024") != std::string::npos);
  CHECK(error("model:\n  input: [1, 28, 28]\n  sequential:\n    - conv2d: {out: 4, kernel: 3, padding: 100000}\n"
              "    - flatten\n    - linear: {out: 2}\n")
            .find("model.sequential[0].conv2d.padding: 100000 is more than 1024") != std::string::npos);
  CHECK(error("model:\n  input: [3, 4096, 4096]\n  sequential:\n    - conv2d: {out: 4096, kernel: 3, padding: 1}\n"
              "    - flatten\n    - linear: {out: 2}\n")
            .find("model.sequential[0].conv2d: gives") != std::string::npos);
  // At the bounds: fine.
  std::string most = "model:\n  layers: [784";
  for (int i = 0; i < 1022; ++i) most += ", 8";
  CHECK(error(most + "]\n") == "(no error)");
}

TEST_CASE("the resolved config in the log is at most a screenful and names the full file") {
  const auto out = test::fresh_dir("echo");
  std::string layers = "model.layers=[2";
  for (int i = 0; i < 300; ++i) layers += ", 4";
  layers += ", 2]";
  const auto text = logged([&] { app::run_training(regression_config(out, {layers, "run.steps=1"})); });
  std::size_t longest = 0, lines = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line); ++lines) longest = std::max(longest, line.size());
  CHECK(longest < 400);
  CHECK(lines < 150);
  CHECK(text.find("(the full config: " + (out / "config.yaml").string() + ")") != std::string::npos);
  CHECK(app::load_config(out / "config.yaml").model.layers.size() == 302);  // the file has all of it
  fs::remove_all(out);
}

TEST_CASE("an evaluation stops between eval batches when asked") {
  const auto out = test::fresh_dir("eval-stop");
  const auto config = regression_config(out, {"data.eval_batch_size=50"});
  const Dataset data = app::load_dataset(config);
  std::string note;
  const auto trainer = app::make_trainer(config, data, note);
  const auto whole = trainer->evaluate();
  CHECK_FALSE(whole.stopped);
  int asked = 0;
  const auto part = trainer->evaluate_cancellable([&] { return ++asked > 2; });
  CHECK(part.stopped);
  CHECK(part.examples == 2 * eval_batch_for(data.test.images.count, 50));
  CHECK(whole.examples > part.examples);
  fs::remove_all(out);
}

TEST_CASE("a stop request that reaches the final evaluation ends the run as interrupted, with a checkpoint") {
  const auto out = test::fresh_dir("final-eval-stop");
  app::run_training(regression_config(out / "a", {"run.checkpoint=a.sgck"}));  // finished: 20 of 20 steps
  // Resuming the finished run has no step to take: the stop, asked from the
  // start, reaches the final evaluation.
  std::atomic<bool> stop{true};
  app::TrainSummary summary;
  const auto text = logged([&] {
    summary = app::run_training(regression_config(out / "b", {"run.resume=" + (out / "a" / "a.sgck").string()}),
                                {&stop, false});
  });
  CHECK(summary.interrupted);
  CHECK(summary.steps == 20);
  CHECK(text.find("evaluation at step 20 stopped after 0 test examples") != std::string::npos);
  CHECK(text.find("stopped: 20 steps") != std::string::npos);
  CHECK(io::load_checkpoint(out / "b" / "checkpoint.sgck").step == 20);
  fs::remove_all(out);
}

TEST_CASE("a relative run.checkpoint goes under run.out_dir") {
  const auto dir = test::fresh_dir("relative-checkpoint");
  const auto cwd = fs::current_path();
  fs::current_path(dir);
  app::run_training(regression_config(dir / "out", {"run.checkpoint=model.sgck"}));
  // A path written for the old rule (relative to the working folder, repeating run.out_dir): a warning.
  const auto text = logged(
      [&] { app::run_training(regression_config("runs/x", {"run.out_dir=runs/x", "run.checkpoint=runs/x/old.sgck"})); });
  fs::current_path(cwd);
  CHECK(fs::exists(dir / "out" / "model.sgck"));
  CHECK_FALSE(fs::exists(dir / "model.sgck"));
  CHECK(fs::exists(dir / "runs/x/runs/x/old.sgck"));
  CHECK(text.find("run.checkpoint runs/x/old.sgck is relative, so it goes under run.out_dir: runs/x/runs/x/old.sgck "
                  "(for runs/x/old.sgck, give run.checkpoint: old.sgck)") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("resume messages: a CNN checkpoint into an MLP config, the same file by another path, a longer cosine run") {
  const auto dir = test::fresh_dir("resume-messages");
  write_tiny_images(dir);
  app::run_training(app::parse_config(image_yaml(dir, dir / "cnn", kCnn), "cnn.yaml"));
  const std::string resume = "run.resume=" + (dir / "cnn" / "c.sgck").string();
  SUBCASE("an MLP config says what the checkpoint's run had") {
    const auto error =
        error_of([&] { app::run_training(app::parse_config(image_yaml(dir, dir / "mlp", kMlp), "mlp.yaml", {resume})); });
    CHECK(error.find("model.layers [16, 8, 3] (an MLP) but the checkpoint's run had model.sequential "
                     "[conv2d{out: 2, kernel: 3, stride: 1, padding: 0}, relu{}, flatten{}, ...] (a CNN, 4 layers)") !=
          std::string::npos);
    CHECK(error.find("but  in") == std::string::npos);
  }
  SUBCASE("the same .npy by a relative path resumes") {
    const auto relative = fs::relative(dir / "x.npy", fs::current_path()).string();
    CHECK(relative.front() != '/');
    CHECK_NOTHROW(app::run_training(app::parse_config(image_yaml(dir, dir / "again", kCnn), "cnn.yaml",
                                                      {resume, "data.train_x=" + relative, "run.steps=8"})));
  }
  SUBCASE("a changed run.steps under a cosine schedule is a warning naming the key") {
    app::run_training(regression_config(dir / "a", {"run.checkpoint=a.sgck", "run.steps=20"}));
    const auto text = logged([&] {
      app::run_training(regression_config(dir / "b", {"run.resume=" + (dir / "a" / "a.sgck").string(), "run.steps=40"}));
    });
    CHECK(text.find("run.steps is 40 here but 20 in the checkpoint's run (40 total steps here, 20 there)") !=
          std::string::npos);
  }
  fs::remove_all(dir);
}
