// On the GPU: configs/mnist_bf16.yaml (the default MLP with bf16 compute)
// reaches >= 98% MNIST test accuracy, as the fp16 default does.
#include <doctest/doctest.h>

#include <random>

#include "apps/config/train_config.hpp"
#include "apps/training_run.hpp"
#include "tests/support/test_data.hpp"

using namespace sg;

TEST_CASE("configs/mnist_bf16.yaml reaches at least 98.0% test accuracy") {
  const auto out = std::filesystem::temp_directory_path() / ("stepgraph-bf16-" + std::to_string(std::random_device{}()));
  const auto config = app::load_config(sg::test::source_dir() / "configs/mnist_bf16.yaml",
                                       {"data.dir=" + sg::test::mnist_dir_or_skip().string(), "run.out_dir=" + out.string(),
                                        "run.checkpoint=" + (out / "c.sgck").string(), "backend.kind=cuda"});
  REQUIRE(config.precision.compute == "bf16");
  const auto summary = app::run_training(config);
  MESSAGE("bf16 config: " << summary.steps << " steps in " << summary.seconds << " s, test accuracy "
                          << 100 * summary.final_eval.accuracy << "% on " << summary.backend);
  CHECK(summary.final_eval.examples == 10000);
  CHECK(summary.final_eval.accuracy >= 0.98);
  std::filesystem::remove_all(out);
}
