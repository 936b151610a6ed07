// YAML configs: shipped files load, bad files fail with file:line: key.
#include <doctest/doctest.h>

#include "apps/config/backend_options_from_config.hpp"
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

TEST_CASE("backend: lowering switches and kernel knobs parse, default as BackendOptions does, and map onto it") {
  const auto defaults = parse_config(kMinimal, "t.yaml");
  const sg::BackendOptions d = backend_options_from_config(defaults);
  const sg::BackendOptions plain;
  CHECK(defaults.backend.options.whole_step_mode == sg::WholeStepMode::automatic);
  CHECK(d.whole_step_mode == plain.whole_step_mode);
  CHECK(d.small_batch_forward == plain.small_batch_forward);
  CHECK(d.fold_input_update == plain.fold_input_update);
  CHECK(d.dependent_launch == plain.dependent_launch);
  CHECK(d.classifier_mma == plain.classifier_mma);
  CHECK(d.one_pass_multicast == plain.one_pass_multicast);
  CHECK(d.strip_splits == plain.strip_splits);
  CHECK(d.resident_cluster == plain.resident_cluster);
  CHECK(d.whole_step == plain.whole_step);
  CHECK(d.one_pass_backward == plain.one_pass_backward);
  CHECK(d.steps_per_launch == plain.steps_per_launch);
  CHECK(d.cudnn_knob_variants == plain.cudnn_knob_variants);
  CHECK(d.cudnn_knob_variants == 256);
  CHECK(d.gradient_streams == 0);  // auto
  CHECK(d.weight_gradient_stream == plain.weight_gradient_stream);
  CHECK(d.weight_gradient_stream);
  CHECK_FALSE(d.accumulate_f16);

  const auto c = parse_config(std::string(kMinimal) +
                                  "precision:\n  accumulate: fp16\n"
                                  "backend:\n  whole_step_mode: resident\n  small_batch_forward: false\n"
                                  "  fold_input_update: false\n  dependent_launch: false\n  classifier_mma: false\n"
                                  "  one_pass_multicast: false\n  strip_splits: 4\n  resident_cluster: 8\n"
                                  "  autotune: true\n  whole_step: false\n  one_pass_backward: false\n"
                                  "  steps_per_launch: 3\n  weight_gradient_stream: false\n  cudnn_knob_variants: 96\n",
                              "t.yaml");
  const sg::BackendOptions o = backend_options_from_config(c);
  CHECK(o.whole_step_mode == sg::WholeStepMode::resident);
  CHECK_FALSE(o.small_batch_forward);
  CHECK_FALSE(o.fold_input_update);
  CHECK_FALSE(o.dependent_launch);
  CHECK_FALSE(o.classifier_mma);
  CHECK_FALSE(o.one_pass_multicast);
  CHECK(o.strip_splits == 4);
  CHECK(o.resident_cluster == 8);
  CHECK(o.autotune);
  CHECK_FALSE(o.whole_step);
  CHECK_FALSE(o.one_pass_backward);
  CHECK(o.steps_per_launch == 3);
  CHECK(o.cudnn_knob_variants == 96);
  CHECK_FALSE(o.weight_gradient_stream);
  CHECK(o.accumulate_f16);

  for (const char* mode : {"auto", "grid", "cluster", "resident"}) {
    INFO(mode);
    const auto m = parse_config(kMinimal, "t.yaml", {std::string("backend.whole_step_mode=") + mode});
    CHECK(sg::whole_step_mode_name(backend_options_from_config(m).whole_step_mode) == mode);
  }
  for (const char* splits : {"0", "1", "2", "4", "8"})
    CHECK(error_of(kMinimal, {std::string("backend.strip_splits=") + splits}) == "");
  for (const char* cluster : {"0", "1", "2", "4", "8", "16"})
    CHECK(error_of(kMinimal, {std::string("backend.resident_cluster=") + cluster}) == "");
}

TEST_CASE("bad backend: values are errors naming file, line and key") {
  const std::string head = "model:\n  layers: [784, 10]\nrun:\n  steps: 5\nbackend:\n";
  CHECK(error_of(head + "  whole_step_mode: fastest\n") ==
        doctest::Contains("test.yaml:6: backend.whole_step_mode: 'fastest' is not one of auto, grid, cluster, resident"));
  CHECK(error_of(head + "  strip_splits: 3\n") ==
        doctest::Contains("test.yaml:6: backend.strip_splits: must be 0 (the measured rule) or a power of two up to 8"));
  CHECK(error_of(head + "  strip_splits: 16\n") == doctest::Contains("test.yaml:6: backend.strip_splits:"));
  CHECK(error_of(head + "  strip_splits: -2\n") == doctest::Contains("test.yaml:6: backend.strip_splits:"));
  CHECK(error_of(head + "  resident_cluster: 3\n") ==
        doctest::Contains("test.yaml:6: backend.resident_cluster: must be 0 (the largest that fits) or one of 16, 8, 4, 2, 1"));
  CHECK(error_of(head + "  resident_cluster: 32\n") == doctest::Contains("test.yaml:6: backend.resident_cluster:"));
  CHECK(error_of(head + "  dependent_launch: sometimes\n") ==
        doctest::Contains("test.yaml:6: backend.dependent_launch: expected true or false, got 'sometimes'"));
  CHECK(error_of(head + "  classifier_mma: 2\n") == doctest::Contains("test.yaml:6: backend.classifier_mma: expected true or false"));
  CHECK(error_of(head + "  weight_gradient_stream: maybe\n") ==
        doctest::Contains("test.yaml:6: backend.weight_gradient_stream: expected true or false, got 'maybe'"));
  CHECK(error_of(head + "  strip_splits: many\n") ==
        doctest::Contains("test.yaml:6: backend.strip_splits: expected an integer, got 'many'"));
  CHECK(error_of(head + "  multicast: false\n") == doctest::Contains("test.yaml:6: backend.multicast: unknown key"));
  CHECK(error_of(head + "  gradient_streams: 3\n") ==
        doctest::Contains("test.yaml:6: backend.gradient_streams: must be 0 (auto: 2, a data-parallel rank 1), 1 "
                          "or 2"));
  CHECK(error_of(head + "  cudnn_knob_variants: 513\n") ==
        doctest::Contains("test.yaml:6: backend.cudnn_knob_variants: must be 0-512"));
  CHECK(error_of(head + "  cudnn_knob_variants: -1\n") == doctest::Contains("backend.cudnn_knob_variants: must be"));
  CHECK(error_of(kMinimal, {"backend.resident_cluster=5"}) == doctest::Contains("backend.resident_cluster: must be"));
  CHECK(error_of(kMinimal, {"backend.whole_step_mode=grids"}) == doctest::Contains("backend.whole_step_mode: 'grids'"));
}

TEST_CASE("the backend: keys round-trip through YAML") {
  const auto c = parse_config(kMinimal, "t.yaml",
                              {"backend.whole_step_mode=cluster", "backend.small_batch_forward=false",
                               "backend.fold_input_update=false", "backend.dependent_launch=false",
                               "backend.classifier_mma=false", "backend.one_pass_multicast=false",
                               "backend.strip_splits=2", "backend.resident_cluster=16"});
  const std::string text = to_yaml(c);
  for (const char* key : {"whole_step_mode: cluster", "small_batch_forward: false", "fold_input_update: false",
                          "dependent_launch: false", "classifier_mma: false", "one_pass_multicast: false",
                          "strip_splits: 2", "resident_cluster: 16"})
    CHECK(text.find(key) != std::string::npos);
  const auto again = parse_config(text, "resolved.yaml");
  CHECK(to_yaml(again) == text);
  CHECK(again.backend.options.whole_step_mode == sg::WholeStepMode::cluster);
  CHECK_FALSE(again.backend.options.small_batch_forward);
  CHECK_FALSE(again.backend.options.fold_input_update);
  CHECK_FALSE(again.backend.options.dependent_launch);
  CHECK_FALSE(again.backend.options.classifier_mma);
  CHECK_FALSE(again.backend.options.one_pass_multicast);
  CHECK(again.backend.options.strip_splits == 2);
  CHECK(again.backend.options.resident_cluster == 16);
}

TEST_CASE("whole-step mode names round-trip, and a bad name is refused") {
  for (auto mode : {sg::WholeStepMode::automatic, sg::WholeStepMode::grid, sg::WholeStepMode::cluster,
                    sg::WholeStepMode::resident})
    CHECK(sg::whole_step_mode_from_name(sg::whole_step_mode_name(mode)) == mode);
  CHECK(sg::whole_step_mode_name(sg::WholeStepMode::automatic) == "auto");
  CHECK_THROWS_AS(sg::whole_step_mode_from_name("automatic"), std::invalid_argument);
}

TEST_CASE("a missing config file is a clear error") {
  CHECK_THROWS_WITH_AS(load_config("/nonexistent/x.yaml"), doctest::Contains("/nonexistent/x.yaml: cannot open"), ConfigError);
}
