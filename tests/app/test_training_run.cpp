// The training app end to end on the CPU backend (CI has no GPU).
#include <doctest/doctest.h>

#include <random>

#include "apps/config/train_config.hpp"
#include "apps/training_run.hpp"
#include "runtime/io/atomic_file.hpp"
#include "runtime/io/checkpoint.hpp"
#include "tests/support/test_data.hpp"
#include "tests/support/checkpoint_checks.hpp"

using namespace sg;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir() {
  return fs::temp_directory_path() / ("stepgraph-run-" + std::to_string(std::random_device{}()));
}

app::TrainConfig ci_config(const fs::path& out, std::vector<std::string> extra = {}) {
  extra.push_back("data.dir=" + sg::test::mnist_dir_or_skip().string());
  extra.push_back("run.out_dir=" + out.string());
  return app::load_config(sg::test::source_dir() / "configs/ci_small.yaml", extra);
}

}  // namespace

TEST_CASE("configs/ci_small.yaml trains end to end and writes its outputs") {
  const auto out = fresh_dir();
  const auto summary = app::run_training(ci_config(out, {"run.checkpoint=" + (out / "final.sgck").string()}));
  CHECK(summary.steps == 300);
  CHECK_FALSE(summary.interrupted);
  CHECK(summary.final_eval.examples == 1000);
  CHECK(summary.final_eval.accuracy > 0.8);
  CHECK(summary.final_train_loss < 1.0);
  for (const char* f : {"config.yaml", "metrics.csv", "metrics.json", "loss.svg", "final.sgck"}) {
    INFO(f);
    CHECK(fs::exists(out / f));
  }
  // The saved resolved config is itself a valid config.
  CHECK_NOTHROW(app::load_config(out / "config.yaml"));
  CHECK(io::load_checkpoint(out / "final.sgck").step == 300);
  fs::remove_all(out);
}

TEST_CASE("resume from a checkpoint continues bit-exactly: 200 steps == 100 + resume + 100") {
  const auto out = fresh_dir();
  app::run_training(ci_config(out / "a", {"run.steps=200", "optim.momentum=0.9", "run.checkpoint=" + (out / "a.sgck").string()}));
  app::run_training(ci_config(out / "b", {"run.steps=100", "optim.momentum=0.9", "run.checkpoint=" + (out / "b.sgck").string()}));
  app::run_training(ci_config(out / "c", {"run.steps=200", "optim.momentum=0.9", "run.resume=" + (out / "b.sgck").string(),
                                          "run.checkpoint=" + (out / "c.sgck").string()}));
  test::check_same_checkpoints(out / "a.sgck", out / "c.sgck", 200);
  fs::remove_all(out);
}

TEST_CASE("a NaN loss stops the run with a message naming the step") {
  const auto out = fresh_dir();
  CHECK_THROWS_WITH_AS(app::run_training(ci_config(out, {"optim.lr=1e30"})), doctest::Contains("at step 50"),
                       app::TrainingError);
  fs::remove_all(out);
}

TEST_CASE("a stop request (Ctrl-C) saves a checkpoint and reports the interruption") {
  const auto out = fresh_dir();
  std::atomic<bool> stop{true};
  const auto summary = app::run_training(ci_config(out), {&stop, false});
  CHECK(summary.interrupted);
  CHECK(summary.steps == 0);
  CHECK(fs::exists(out / "checkpoint.sgck"));
  fs::remove_all(out);
}

TEST_CASE("a model whose input does not match the images is a clear error") {
  const auto out = fresh_dir();
  CHECK_THROWS_WITH_AS(app::run_training(ci_config(out, {"model.layers=[100, 10]"})),
                       doctest::Contains("model.layers[0] is 100 but the images"), app::ConfigError);
  fs::remove_all(out);
}
