// Issue 21's optim keys: name, betas, eps, nesterov, clip_grad_norm parse,
// validate with one clear line, round-trip through the resolved YAML, reach
// the optimizer spec, and configs/mnist_adamw.yaml loads.
#include <doctest/doctest.h>

#include "apps/backend_choice.hpp"
#include "apps/config/train_config.hpp"
#include "tests/support/test_data.hpp"

using namespace sg;
using namespace sg::app;

namespace {

const char* kMinimal = "model:\n  layers: [784, 64, 10]\nrun:\n  steps: 10\n";

doctest::String error_of(const std::vector<std::string>& overrides) {
  try {
    parse_config(kMinimal, "test.yaml", overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("optim: adamw with betas, eps and clipping parses, round-trips and reaches the optimizer spec") {
  const auto c = parse_config(kMinimal, "t.yaml",
                              {"optim.name=adamw", "optim.betas=[0.8, 0.95]", "optim.eps=1e-6",
                               "optim.weight_decay=0.05", "optim.clip_grad_norm=2.5"});
  CHECK(c.optim.name == "adamw");
  CHECK(c.optim.beta1 == 0.8);
  CHECK(c.optim.beta2 == 0.95);
  CHECK(c.optim.eps == 1e-6);
  CHECK(c.optim.clip_grad_norm == 2.5);
  const auto again = parse_config(to_yaml(c), "resolved.yaml");
  CHECK(to_yaml(again) == to_yaml(c));
  const MlpTraining t = mlp_training(c);
  CHECK(t.sgd.kind == OptimizerKind::adamw);
  CHECK(t.sgd.beta1 == 0.8);
  CHECK(t.sgd.beta2 == 0.95);
  CHECK(t.sgd.eps == 1e-6);
  CHECK(t.sgd.weight_decay == 0.05);
  CHECK(t.sgd.clip_grad_norm == 2.5);

  const auto n = parse_config(kMinimal, "t.yaml", {"optim.momentum=0.9", "optim.nesterov=true"});
  CHECK(mlp_training(n).sgd.nesterov);
  CHECK(mlp_training(n).sgd.kind == OptimizerKind::sgd);
}

TEST_CASE("optim: bad values are one clear line naming the key") {
  CHECK(error_of({"optim.name=lamb"}) == doctest::Contains("optim.name"));
  CHECK(error_of({"optim.betas=[0.9]"}) == doctest::Contains("optim.betas: expected a list of two numbers"));
  CHECK(error_of({"optim.betas=[0.9, 1.0]"}) == doctest::Contains("optim.betas: both must be in [0, 1)"));
  CHECK(error_of({"optim.eps=0"}) == doctest::Contains("optim.eps: must be > 0"));
  CHECK(error_of({"optim.clip_grad_norm=-1"}) == doctest::Contains("optim.clip_grad_norm: must be >= 0"));
  CHECK(error_of({"optim.nesterov=true"}) == doctest::Contains("optim.nesterov: needs optim.momentum > 0"));
  CHECK(error_of({"optim.name=adam", "optim.momentum=0.9"}) == doctest::Contains("optim.momentum: applies to optim.name: sgd"));
  CHECK(error_of({"optim.name=adamw", "optim.nesterov=true"}) == doctest::Contains("optim.nesterov: applies to optim.name: sgd"));
}

TEST_CASE("configs/mnist_adamw.yaml loads: the default-style MLP with AdamW") {
  const auto c = load_config(sg::test::source_dir() / "configs/mnist_adamw.yaml");
  CHECK(c.optim.name == "adamw");
  CHECK(c.model.layers == std::vector<std::int64_t>{784, 1024, 1024, 10});
  CHECK(c.optim.weight_decay > 0);
}
