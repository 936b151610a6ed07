// YAML configs: shipped files load, bad files fail with file:line: key.
#include <doctest/doctest.h>

#include "apps/config/train_config.hpp"
#include "tests/support/test_data.hpp"

using namespace sg::app;

namespace {

// The error message (doctest's String, so CHECK(... == doctest::Contains(...)) prints it).
doctest::String error_of(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(yaml, "test.yaml", overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

const char* kMinimal = "model:\n  layers: [784, 64, 10]\nrun:\n  steps: 10\n";

}  // namespace

TEST_CASE("every shipped config loads and validates") {
  for (const char* name : {"mnist_mlp", "parity_reference", "wide_4096", "ci_small", "mnist_cpu"}) {
    INFO(name);
    const auto c = load_config(sg::test::source_dir() / "configs" / (std::string(name) + ".yaml"));
    CHECK(c.model.layers.size() >= 3);
    CHECK(c.model.layers.front() == 784);
  }
  const auto parity = load_config(sg::test::source_dir() / "configs/parity_reference.yaml");
  CHECK(parity.model.layers == std::vector<std::int64_t>{784, 128, 128, 128, 10});
  CHECK(parity.data.batch_size == 32);
  CHECK(parity.optim.lr == 0.003);
  CHECK(parity.run.steps == 5000);
  const auto wide = load_config(sg::test::source_dir() / "configs/wide_4096.yaml");
  CHECK(wide.model.layers == std::vector<std::int64_t>{784, 4096, 4096, 4096, 10});
}

TEST_CASE("defaults fill what a file leaves out") {
  const auto c = parse_config(kMinimal, "t.yaml");
  CHECK(c.data.batch_size == 32);
  CHECK(c.optim.name == "sgd");
  CHECK(c.backend.kind == "auto");
  CHECK(c.precision.weights == "fp16");
}

TEST_CASE("unknown keys, wrong types and bad values name file, line and key") {
  CHECK(error_of("model:\n  layers: [784, 10]\nrun:\n  steps: 5\nbogus: 1\n") ==
        doctest::Contains("test.yaml:5: bogus: unknown key"));
  CHECK(error_of("model:\n  layers: [784, 10]\n  widht: 3\nrun:\n  steps: 5\n") ==
        doctest::Contains("test.yaml:3: model.widht: unknown key"));
  CHECK(error_of("model:\n  layers: [784, 10]\nrun:\n  steps: 5\noptim:\n  schedule:\n    knd: cosine\n") ==
        doctest::Contains("test.yaml:7: optim.schedule.knd: unknown key"));
  CHECK(error_of("model:\n  layers: [784, 10]\nrun:\n  steps: 5\noptim:\n  lr: fast\n") ==
        doctest::Contains("test.yaml:6: optim.lr: expected a number, got 'fast'"));
  CHECK(error_of("model:\n  layers: [784, 10]\nrun:\n  steps: 5\ndata:\n  batch_size: {a: 1}\n") ==
        doctest::Contains("test.yaml:6: data.batch_size: expected an integer, got a mapping"));
  CHECK(error_of("model:\n  layers: [784, 10]\nrun:\n  steps: 5\noptim:\n  lr: -1\n") ==
        doctest::Contains("test.yaml:6: optim.lr: must be > 0"));
  CHECK(error_of("model:\n  layers: [784, 10]\nrun:\n  steps: 5\n  epochs: 2\n") ==
        doctest::Contains("run.steps: set exactly one"));
  CHECK(error_of("model:\n  layers: [784, 10]\nrun:\n  steps: 5\nprecision:\n  weights: fp32\n  accumulate: fp16\n") ==
        doctest::Contains("test.yaml:7: precision.accumulate: cuBLASLt has no fp16 accumulation"));
  CHECK(error_of("model:\n  layers: [784, 10]\n  hidden_width: 64\n  hidden_depth: 2\nrun:\n  steps: 5\n") ==
        doctest::Contains("either model.layers or"));
  CHECK(error_of("model:\n  layers: [784, 10\nrun: {steps: 5}\n") == doctest::Contains("test.yaml:"));
  CHECK(error_of("model:\n  layers: [784, 10\nrun: {steps: 5}\n") == doctest::Contains("invalid YAML"));
  CHECK(error_of("backend:\n  kind: tpu\nmodel:\n  layers: [784, 10]\nrun:\n  steps: 5\n") ==
        doctest::Contains("test.yaml:2: backend.kind: 'tpu' is not one of auto, cuda, cpu"));
}

TEST_CASE("the width/depth form expands into layers") {
  const auto c = parse_config("model:\n  hidden_width: 64\n  hidden_depth: 3\nrun:\n  steps: 5\n", "t.yaml");
  CHECK(c.model.layers == std::vector<std::int64_t>{784, 64, 64, 64, 10});
}

TEST_CASE("--set overrides any key, and bad overrides are errors") {
  const auto c = parse_config(kMinimal, "t.yaml", {"optim.lr=0.25", "optim.schedule.kind=cosine", "data.batch_size=64"});
  CHECK(c.optim.lr == 0.25);
  CHECK(c.optim.schedule.kind == "cosine");
  CHECK(c.data.batch_size == 64);
  CHECK(error_of(kMinimal, {"optim.lrr=1"}) == doctest::Contains("unknown key 'optim.lrr'"));
  CHECK(error_of(kMinimal, {"optim.lr"}) == doctest::Contains("expected key.path=value"));
  CHECK(error_of(kMinimal, {"optim.lr=abc"}) == doctest::Contains("optim.lr: expected a number, got 'abc'"));
}

TEST_CASE("the resolved config round-trips through YAML") {
  const auto c = load_config(sg::test::source_dir() / "configs/mnist_mlp.yaml", {"run.seed=7", "optim.lr=0.0123"});
  const auto again = parse_config(to_yaml(c), "resolved.yaml");
  CHECK(to_yaml(again) == to_yaml(c));
  CHECK(again.optim.lr == c.optim.lr);
  CHECK(again.run.seed == 7);
  CHECK(again.model.layers == c.model.layers);
  CHECK(again.optim.schedule.kind == "cosine");
}

TEST_CASE("a missing config file is a clear error") {
  CHECK_THROWS_WITH_AS(load_config("/nonexistent/x.yaml"), doctest::Contains("/nonexistent/x.yaml: cannot open"), ConfigError);
}
