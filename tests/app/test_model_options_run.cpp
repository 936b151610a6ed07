// Issue 21's model options end to end on the CPU backend (CI has no GPU):
// configs/regression_mse.yaml trains and reports a test loss without an
// accuracy; activations, dropout and label smoothing train on MNIST and
// resume bit-exactly; bad values are one clear config error.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <random>
#include <sstream>

#include "apps/config/train_config.hpp"
#include "apps/training_run.hpp"
#include "runtime/io/checkpoint.hpp"
#include "tests/support/test_data.hpp"
#include "tests/support/checkpoint_checks.hpp"

using namespace sg;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir() {
  return fs::temp_directory_path() / ("stepgraph-model-options-" + std::to_string(std::random_device{}()));
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// configs/regression_mse.yaml at tiny sizes, reading the shipped CSV from the source tree.
app::TrainConfig regression_config(const fs::path& out, std::vector<std::string> extra = {}) {
  extra.push_back("data.train_x=" + (sg::test::source_dir() / "configs/data/inr_pattern.csv").string());
  extra.push_back("run.out_dir=" + out.string());
  extra.push_back("backend.kind=cpu");
  return app::load_config(sg::test::source_dir() / "configs/regression_mse.yaml", extra);
}

app::TrainConfig mnist_config(const fs::path& out, std::vector<std::string> extra = {}) {
  extra.push_back("data.dir=" + sg::test::mnist_dir_or_skip().string());
  extra.push_back("run.out_dir=" + out.string());
  return app::load_config(sg::test::source_dir() / "configs/ci_small.yaml", extra);
}

}  // namespace

TEST_CASE("configs/regression_mse.yaml learns its image on the CPU backend and reports test loss only") {
  const auto out = fresh_dir();
  // 1500 steps of a narrower network: seconds on one core.
  const auto summary = app::run_training(
      regression_config(out, {"model.layers=[2, 32, 32, 2]", "run.steps=1500", "run.eval_every=500"}));
  CHECK(summary.steps == 1500);
  CHECK(std::isnan(summary.final_eval.accuracy));
  CHECK(summary.final_eval.examples > 0);
  // Predicting the targets' mean everywhere scores 0.18 (0 everywhere: 0.33);
  // the network must do far better than either.
  MESSAGE("regression test MSE " << summary.final_eval.loss);
  CHECK(summary.final_eval.loss < 0.02);
  // metrics.csv leaves the accuracy column empty; the plot has no error curve.
  const std::string csv = read_text(out / "metrics.csv");
  CHECK(csv.find(",,") != std::string::npos);
  CHECK(csv.find("nan") == std::string::npos);
  CHECK(read_text(out / "loss.svg").find("test error") == std::string::npos);
  CHECK(read_text(out / "config.yaml").find("loss: mse") != std::string::npos);
  fs::remove_all(out);
}

TEST_CASE("gelu_tanh + dropout + label smoothing train on MNIST and resume bit-exactly") {
  const auto out = fresh_dir();
  const std::vector<std::string> model = {"model.activation=gelu_tanh", "model.dropout=0.2",
                                          "model.label_smoothing=0.1", "optim.momentum=0.9"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), model.begin(), model.end());
    return extra;
  };
  const auto a = app::run_training(mnist_config(out / "a", with({"run.steps=200", "run.checkpoint=" + (out / "a.sgck").string()})));
  app::run_training(mnist_config(out / "b", with({"run.steps=100", "run.checkpoint=" + (out / "b.sgck").string()})));
  app::run_training(mnist_config(out / "c", with({"run.steps=200", "run.resume=" + (out / "b.sgck").string(),
                                                  "run.checkpoint=" + (out / "c.sgck").string()})));
  CHECK(a.final_eval.accuracy > 0.75);
  test::check_same_checkpoints(out / "a.sgck", out / "c.sgck", 200);
  // A resume that changes the dropout would change the trajectory: refused.
  CHECK_THROWS_WITH_AS(app::run_training(mnist_config(out / "d", {"model.activation=gelu_tanh", "model.dropout=0.3",
                                                                  "model.label_smoothing=0.1", "optim.momentum=0.9",
                                                                  "run.steps=200",
                                                                  "run.resume=" + (out / "b.sgck").string()})),
                       doctest::Contains("model.dropout"), app::ConfigError);
  fs::remove_all(out);
}

TEST_CASE("every activation trains the CI network on the CPU backend") {
  for (const char* activation : {"gelu", "silu", "tanh", "sigmoid", "identity"}) {
    INFO(std::string(activation));
    const auto out = fresh_dir();
    const auto s = app::run_training(mnist_config(out, {std::string("model.activation=") + activation, "run.steps=150",
                                                        "run.eval_every=0"}));
    CHECK(s.final_eval.accuracy > 0.5);  // chance: 0.1
    fs::remove_all(out);
  }
}

TEST_CASE("bad model.activation / loss / label_smoothing / dropout values are one clear config error") {
  const auto out = fresh_dir();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"model.activation=swish", "model.activation: 'swish' is not one of relu, gelu, gelu_tanh, silu, tanh, sigmoid, identity"},
      {"model.loss=huber", "model.loss: 'huber' is not one of softmax_xent, mse, l1"},
      {"model.dropout=1.0", "model.dropout: must be in [0, 1)"},
      {"model.label_smoothing=-0.1", "model.label_smoothing: must be in [0, 1]"},
  };
  for (const auto& [set, message] : cases) {
    INFO(set);
    CHECK_THROWS_WITH_AS(mnist_config(out, {set}), doctest::Contains(message.c_str()), app::ConfigError);
  }
  CHECK_THROWS_WITH_AS(mnist_config(out, {"model.loss=mse", "model.label_smoothing=0.1"}),
                       doctest::Contains("model.label_smoothing: applies to model.loss softmax_xent, not mse"),
                       app::ConfigError);
}
