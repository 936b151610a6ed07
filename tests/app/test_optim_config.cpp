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
  CHECK(t.optimizer.kind == OptimizerKind::adamw);
  CHECK(t.optimizer.beta1 == 0.8);
  CHECK(t.optimizer.beta2 == 0.95);
  CHECK(t.optimizer.eps == 1e-6);
  CHECK(t.optimizer.weight_decay == 0.05);
  CHECK(t.optimizer.clip_grad_norm == 2.5);

  const auto n = parse_config(kMinimal, "t.yaml", {"optim.momentum=0.9", "optim.nesterov=true"});
  CHECK(mlp_training(n).optimizer.nesterov);
  CHECK(mlp_training(n).optimizer.kind == OptimizerKind::sgd);
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

TEST_CASE("optim: rmsprop with alpha, eps, momentum, centered and weight decay parses, round-trips and reaches the spec") {
  const auto c = parse_config(kMinimal, "t.yaml",
                              {"optim.name=rmsprop", "optim.alpha=0.9", "optim.eps=1e-6", "optim.momentum=0.5",
                               "optim.centered=true", "optim.weight_decay=0.01", "optim.clip_grad_norm=1"});
  CHECK(c.optim.name == "rmsprop");
  CHECK(c.optim.alpha == 0.9);
  CHECK(c.optim.centered);
  const auto again = parse_config(to_yaml(c), "resolved.yaml");
  CHECK(to_yaml(again) == to_yaml(c));
  CHECK(again.optim.alpha == 0.9);
  CHECK(again.optim.centered);
  const MlpTraining t = mlp_training(c);
  CHECK(t.optimizer.kind == OptimizerKind::rmsprop);
  CHECK(t.optimizer.alpha == 0.9);
  CHECK(t.optimizer.eps == 1e-6);
  CHECK(t.optimizer.momentum == 0.5);
  CHECK(t.optimizer.centered);
  CHECK(t.optimizer.weight_decay == 0.01);
  CHECK(t.optimizer.clip_grad_norm == 1.0);
  // PyTorch's defaults when only the name is given.
  const MlpTraining d = mlp_training(parse_config(kMinimal, "t.yaml", {"optim.name=rmsprop"}));
  CHECK(d.optimizer.alpha == 0.99);
  CHECK_FALSE(d.optimizer.centered);
  CHECK(d.optimizer.momentum == 0.0);
}

TEST_CASE("optim: bad rmsprop values are one clear line naming the key") {
  CHECK(error_of({"optim.name=rmsprop", "optim.alpha=1"}) == doctest::Contains("optim.alpha: must be in [0, 1)"));
  CHECK(error_of({"optim.name=rmsprop", "optim.alpha=-0.1"}) == doctest::Contains("optim.alpha: must be in [0, 1)"));
  CHECK(error_of({"optim.name=rmsprop", "optim.eps=0"}) == doctest::Contains("optim.eps: must be > 0"));
  CHECK(error_of({"optim.name=rmsprop", "optim.centered=3"}) == doctest::Contains("optim.centered"));
  CHECK(error_of({"optim.name=rmsprop", "optim.momentum=1"}) == doctest::Contains("optim.momentum: must be in [0, 1)"));
  CHECK(error_of({"optim.name=rmsprop", "optim.nesterov=true", "optim.momentum=0.9"}) ==
        doctest::Contains("optim.nesterov: applies to optim.name: sgd"));
  CHECK(error_of({"optim.name=adam", "optim.centered=true"}) == doctest::Contains("optim.centered: applies to optim.name: rmsprop"));
  CHECK(error_of({"optim.name=sgd", "optim.alpha=0.9"}) == doctest::Contains("optim.alpha: applies to optim.name: rmsprop"));
  CHECK(error_of({"optim.name=rmsprop", "optim.momentum=0.9"}) == "");  // momentum is RMSprop's too
}

TEST_CASE("configs/mnist_adamw.yaml loads: the default-style MLP with AdamW") {
  const auto c = load_config(sg::test::source_dir() / "configs/mnist_adamw.yaml");
  CHECK(c.optim.name == "adamw");
  CHECK(c.model.layers == std::vector<std::int64_t>{784, 1024, 1024, 10});
  CHECK(c.optim.weight_decay > 0);
}
