// Issue 22's model.sequential (apps/config) and the Sequential model builder
// (models/sequential.hpp) on the CPU backend: the Sequential form of an MLP is
// the MLP's graph, bad layer lists are one clear error, a tiny CNN learns,
// a CNN run resumes bit-exactly, configs/mnist_cnn.yaml builds.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include <fmt/format.h>

#include "apps/backend_choice.hpp"
#include "apps/config/train_config.hpp"
#include "apps/training_run.hpp"
#include "graph/dump.hpp"
#include "models/sequential_program.hpp"
#include "runtime/io/checkpoint.hpp"
#include "tests/support/temp_files.hpp"
#include "tests/support/test_data.hpp"
#include "tests/support/error_text.hpp"
#include "tests/support/training_helpers.hpp"
#include "tests/support/checkpoint_checks.hpp"

using namespace sg;
namespace fs = std::filesystem;

namespace {

const char* kTail = R"(
data:
  batch_size: 8
optim:
  lr: 0.05
  momentum: 0.9
run:
  steps: 10
backend:
  kind: cpu
)";

app::TrainConfig parse(const std::string& model_yaml, const std::vector<std::string>& overrides = {}) {
  return app::parse_config(model_yaml + kTail, "test.yaml", overrides);
}

std::string error_of(const std::string& model_yaml) {
  return test::error_of([&] { parse(model_yaml); });
}

}  // namespace

TEST_CASE("model.sequential of an MLP builds the same graphs and initial values as model.layers") {
  struct Case {
    const char* activation;
    const char* dropout;
  };
  for (const Case c : {Case{"relu", "0.0"}, Case{"gelu_tanh", "0.25"}, Case{"silu", "0.0"}, Case{"identity", "0.5"},
                       Case{"sigmoid", "0.1"}, Case{"gelu", "0.0"}, Case{"tanh", "0.3"}}) {
    INFO(c.activation << " dropout " << c.dropout);
    const bool drop = std::string(c.dropout) != "0.0";
    const auto mlp = parse(fmt::format("model:\n  layers: [20, 16, 12, 5]\n  activation: {}\n  dropout: {}\n",
                                       c.activation, c.dropout));
    const std::string act = fmt::format("    - {}: {{}}\n", c.activation);
    const std::string dr = drop ? fmt::format("    - dropout: {{p: {}}}\n", c.dropout) : "";
    const auto seq = parse("model:\n  input: [20]\n  sequential:\n    - linear: {out: 16}\n" + act + dr +
                           "    - linear: {out: 12}\n" + act + dr + "    - linear: {out: 5}\n");
    CHECK(seq.model.is_sequential());
    CHECK(seq.model.input == 20);
    CHECK(seq.model.classes == 5);
    for (const auto target : {ProgramTarget::cpu, ProgramTarget::cuda}) {
      const auto a = app::trainer_spec(mlp, 64, 32, target).program;
      const auto b = app::trainer_spec(seq, 64, 32, target).program;
      CHECK(dump_text(a.train) == dump_text(b.train));
      CHECK(dump_text(a.eval) == dump_text(b.eval));
      CHECK(a.train == b.train);
      CHECK(a.eval == b.eval);
      REQUIRE(a.init.size() == b.init.size());
      for (std::size_t i = 0; i < a.init.size(); ++i) {
        CHECK(a.init[i].name == b.init[i].name);
        CHECK(a.init[i].shape == b.init[i].shape);
        CHECK(a.init[i].values == b.init[i].values);
      }
    }
  }
}

TEST_CASE("bad model.sequential lists give one clear error naming the file, line, index and key") {
  const auto has = [](const std::string& message, std::initializer_list<const char*> parts) {
    INFO(message);
    for (const char* p : parts) CHECK(message.find(p) != std::string::npos);
  };
  has(error_of("model:\n  input: [1, 4, 4]\n  sequential:\n    - conv2d: {out: 2, kernel: 5}\n    - flatten\n"
               "    - linear: {out: 3}\n"),
      {"test.yaml:4:", "model.sequential[0].conv2d", "kernel 5 is larger than its (padded) input 4x4"});
  has(error_of("model:\n  input: [1, 8, 8]\n  sequential:\n    - conv2d: {out: 2, kernel: 3}\n    - linear: {out: 3}\n"),
      {"test.yaml:5:", "model.sequential[1].linear", "[2,6,6]", "put a flatten layer before it"});
  has(error_of("model:\n  input: [1, 8, 8]\n  sequential:\n    - max_pool2d: {kernel: 2}\n    - max_pool2d: {kernel: 2}\n"
               "    - max_pool2d: {kernel: 2}\n    - max_pool2d: {kernel: 2}\n    - flatten\n    - linear: {out: 3}\n"),
      {"test.yaml:7:", "model.sequential[3].max_pool2d", "kernel 2 is larger than its input 1x1"});
  has(error_of("model:\n  input: [16]\n  sequential:\n    - conv2d: {out: 2, kernel: 3}\n    - linear: {out: 3}\n"),
      {"test.yaml:4:", "model.sequential[0].conv2d", "[channels, height, width]"});
  has(error_of("model:\n  input: [1, 8, 8]\n  sequential:\n    - conv2d: {out: 2, kernel: 3}\n"),
      {"model.sequential[0].conv2d", "end with flatten and a linear layer"});
  has(error_of("model:\n  input: [16]\n  sequential:\n    - linear: {out: 8}\n    - conv3d: {out: 2}\n"),
      {"test.yaml:5:", "model.sequential[1]", "unknown layer 'conv3d'", "max_pool2d"});
  has(error_of("model:\n  input: [16]\n  sequential:\n    - linear: {outs: 8}\n"),
      {"test.yaml:4:", "model.sequential[0].linear.outs", "unknown option (known here: out, bias, name, inputs)"});
  has(error_of("model:\n  input: [16]\n  sequential:\n    - linear: {}\n"),
      {"test.yaml:4:", "model.sequential[0].linear.out", "is required for linear"});
  has(error_of("model:\n  input: [16]\n  sequential:\n    - linear: {out: ten}\n"),
      {"test.yaml:4:", "model.sequential[0].linear.out", "expected an integer, got 'ten'"});
  has(error_of("model:\n  input: [16]\n  sequential:\n    - linear: {out: 8}\n    - dropout: {p: 1.5}\n    - linear: {out: 3}\n"),
      {"test.yaml:5:", "model.sequential[1].dropout.p", "must be in [0, 1)"});
  has(error_of("model:\n  input: [16]\n  sequential:\n    - linear: {out: 8}\n    - layer_norm: {eps: 0}\n    - linear: {out: 3}\n"),
      {"test.yaml:5:", "model.sequential[1].layer_norm.eps", "must be > 0"});
  has(error_of("model:\n  input: [16]\n  sequential:\n    - global_avg_pool2d\n    - linear: {out: 3}\n"),
      {"test.yaml:4:", "model.sequential[0].global_avg_pool2d", "[channels, height, width]"});
  has(error_of("model:\n  input: [1, 4, 4]\n  sequential:\n    - avg_pool2d: {}\n    - flatten\n    - linear: {out: 3}\n"),
      {"test.yaml:4:", "model.sequential[0].avg_pool2d.kernel", "is required for avg_pool2d"});
  has(error_of("model:\n  input: [16]\n  sequential:\n    - linear: {out: 8}\n    - relu: {p: 1}\n    - linear: {out: 3}\n"),
      {"test.yaml:5:", "model.sequential[1].relu.p", "relu takes only name and inputs"});
  has(error_of("model:\n  input: [16]\n  sequential:\n    - [linear, 8]\n"),
      {"test.yaml:4:", "model.sequential[0]", "expected one layer"});
  has(error_of("model:\n  layers: [16, 3]\n  input: [16]\n  sequential:\n    - linear: {out: 3}\n"),
      {"model.sequential", "not both"});
  has(error_of("model:\n  sequential:\n    - linear: {out: 3}\n"), {"model.input", "[C, H, W]"});
  has(error_of("model:\n  input: [16]\n  activation: gelu\n  sequential:\n    - linear: {out: 3}\n"),
      {"test.yaml:3:", "model.activation", "activation layers"});
  has(error_of("model:\n  input: [16]\n  sequential: []\n"), {"model.sequential", "at least one layer"});
  has(error_of("model:\n  input: [1, 0, 4]\n  sequential:\n    - flatten\n    - linear: {out: 3}\n"),
      {"test.yaml:2:", "model.input", "must be > 0"});
  has(error_of("model:\n  layers: [16, 3]\n  input: [1, 4, 4]\n"), {"model.input", "is for model.sequential"});
}

TEST_CASE("model.sequential round-trips through the resolved config (to_yaml) with its defaults resolved") {
  const auto c = parse(
      "model:\n  input: [3, 9, 7]\n  sequential:\n    - conv2d: {out: 4, kernel: 3, padding: 1, stride: 2}\n"
      "    - max_pool2d: {kernel: 2}\n    - gelu\n    - dropout2d: {p: 0.25}\n    - flatten: {}\n"
      "    - linear: {out: 6}\n    - tanh: {}\n    - dropout: {}\n    - linear: {out: 3}\n");
  REQUIRE(c.model.sequential.size() == 9);
  CHECK(c.model.sequential[0].stride == 2);
  CHECK(c.model.sequential[1].stride == 2);  // max_pool2d: stride = kernel
  CHECK(c.model.sequential[7].p == 0.5);      // PyTorch's default
  CHECK(c.model.input == 3 * 9 * 7);
  CHECK(c.model.classes == 3);
  const auto again = app::parse_config(app::to_yaml(c), "resolved.yaml");
  CHECK(again.model.sequential == c.model.sequential);
  CHECK(again.model.input_shape == c.model.input_shape);
  CHECK(app::to_yaml(again) == app::to_yaml(c));
  CHECK(app::layer_text(c.model.sequential[0]) == "conv2d{out: 4, kernel: 3, stride: 2, padding: 1}");
}

TEST_CASE("issue 37's layers (avg_pool2d, global_avg_pool2d, layer_norm) round-trip with their defaults resolved") {
  const auto c = parse(
      "model:\n  input: [3, 9, 7]\n  sequential:\n    - conv2d: {out: 4, kernel: 3, padding: 1}\n"
      "    - layer_norm\n    - avg_pool2d: {kernel: 2}\n    - layer_norm: {eps: 0.001}\n    - global_avg_pool2d\n"
      "    - linear: {out: 3}\n");
  REQUIRE(c.model.sequential.size() == 6);
  CHECK(c.model.sequential[1].eps == 1e-5);  // PyTorch's default
  CHECK(c.model.sequential[2].stride == 2);  // avg_pool2d: stride = kernel
  CHECK(c.model.sequential[3].eps == 0.001);
  const auto again = app::parse_config(app::to_yaml(c), "resolved.yaml");
  CHECK(again.model.sequential == c.model.sequential);
  CHECK(app::to_yaml(again) == app::to_yaml(c));
  CHECK(app::layer_text(c.model.sequential[3]) == "layer_norm{eps: 0.001}");
  CHECK(app::layer_text(c.model.sequential[2]) == "avg_pool2d{kernel: 2, stride: 2}");
  // Shapes: [4,9,7] -> layer_norm keeps it -> [4,4,3] -> [4] -> [3]; the layer norms hold w/b of their input's shape.
  const auto spec = app::sequential_training(c).model;
  const auto params = sequential_initial_parameters(spec.input_shape, spec.layers, 1);
  REQUIRE(params.size() == 8);
  CHECK(params[2].shape == Shape{4, 9, 7});
  CHECK(params[2].values == std::vector<float>(4 * 9 * 7, 1.f));  // nn.LayerNorm's start: weight 1, bias 0
  CHECK(params[3].values == std::vector<float>(4 * 9 * 7, 0.f));
  CHECK(params[4].shape == Shape{4, 4, 3});
  CHECK(params[6].shape == Shape{3, 4});
}

namespace {

// 8x8 images of 4 classes: class c is a bright 3x3 blob in quadrant c over
// dim noise, so a small CNN can learn it in a few dozen steps.
Dataset quadrant_dataset(std::int64_t rows, std::mt19937_64& rng) {
  auto split = [&](std::int64_t n) {
    data::Split s;
    s.images.count = n;
    s.images.rows = 8;
    s.images.cols = 8;
    s.images.pixels.resize(static_cast<std::size_t>(n * 64));
    s.labels.labels.resize(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) {
      const int c = static_cast<int>(rng() % 4);
      s.labels.labels[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(c);
      std::uint8_t* img = s.images.pixels.data() + i * 64;
      for (int p = 0; p < 64; ++p) img[p] = static_cast<std::uint8_t>(rng() % 60);
      const int r0 = (c / 2) * 4 + static_cast<int>(rng() % 2), c0 = (c % 2) * 4 + static_cast<int>(rng() % 2);
      for (int r = r0; r < r0 + 3; ++r)
        for (int q = c0; q < c0 + 3; ++q) img[r * 8 + q] = static_cast<std::uint8_t>(200 + rng() % 56);
    }
    s.classes = 4;
    return s;
  };
  return {split(rows), split(rows / 2)};
}

SequentialTraining tiny_cnn() {
  SequentialTraining t;
  t.model.input_shape = {1, 8, 8};
  LayerSpec conv{LayerKind::conv2d};
  conv.out = 2;
  conv.kernel = 3;
  LayerSpec pool{LayerKind::max_pool2d};
  pool.kernel = 2;
  LayerSpec relu{LayerKind::activation};
  LayerSpec flatten{LayerKind::flatten};
  LayerSpec linear{LayerKind::linear};
  linear.out = 4;
  t.model.layers = {conv, pool, relu, flatten, linear};
  t.model.batch = 16;
  t.model.weight_dtype = DType::f32;
  t.model.compute_dtype = DType::f32;
  t.optimizer.lr = 0.1;
  t.optimizer.momentum = 0.9;
  t.eval_batch = 64;
  t.init_seed = 7;
  return t;
}

}  // namespace

TEST_CASE("a tiny CNN (conv 2ch k3, pool 2, relu, flatten, linear 4) learns on the CPU backend") {
  std::mt19937_64 rng(3);
  const Dataset data = quadrant_dataset(256, rng);
  const auto t = tiny_cnn();
  const auto shapes = infer_sequential_shapes(t.model.input_shape, t.model.layers);
  CHECK(shapes[0] == Shape{2, 6, 6});
  CHECK(shapes[1] == Shape{2, 3, 3});
  CHECK(shapes[3] == Shape{18});
  TrainerSpec spec;
  spec.program = build_sequential_program(t, data.train.images.count, data.test.images.count, ProgramTarget::cpu);
  // w1 [2,1,3,3]: nn.Conv2d's U(-1/sqrt(9), 1/sqrt(9)) = U(-1/3, 1/3).
  REQUIRE(spec.program.init.size() == 4);
  CHECK(spec.program.init[0].name == "w1");
  CHECK(spec.program.init[0].shape == Shape{2, 1, 3, 3});
  CHECK(spec.program.init[2].shape == Shape{4, 18});
  float max_abs = 0;
  for (float v : spec.program.init[0].values) max_abs = std::max(max_abs, std::fabs(v));
  CHECK(max_abs <= 1.0f / 3.0f);
  CHECK(max_abs > 0.2f);
  auto trainer = make_cpu_trainer(spec, data);
  const auto before = trainer->evaluate();
  const auto l = test::losses(*trainer, 80);
  double first = 0, last = 0;
  for (int i = 0; i < 10; ++i) {
    first += l[static_cast<std::size_t>(i)] / 10;
    last += l[l.size() - 1 - static_cast<std::size_t>(i)] / 10;
  }
  INFO("mean loss of the first 10 steps " << first << ", of the last 10 " << last);
  CHECK(std::isfinite(last));
  CHECK(last < 0.6 * first);
  const auto after = trainer->evaluate();
  CHECK(after.loss < before.loss);
  CHECK(after.accuracy > 0.8);
}

namespace {
app::TrainConfig cnn_config(const fs::path& out, std::vector<std::string> extra = {}) {
  extra.push_back("data.dir=" + test::mnist_dir_or_skip().string());
  extra.push_back("run.out_dir=" + out.string());
  extra.insert(extra.begin(), "backend.kind=cpu");  // a test's own backend.kind comes later and wins
  extra.push_back("data.train_limit=640");
  extra.push_back("data.test_limit=200");
  extra.push_back("data.eval_batch_size=200");
  extra.push_back("run.epochs=0");
  return app::load_config(test::source_dir() / "configs/mnist_cnn.yaml", extra);
}
}  // namespace

TEST_CASE("configs/mnist_cnn.yaml loads and builds the report's network, CUDA takes it only in a build with cuDNN") {
  const auto c = app::load_config(test::source_dir() / "configs/mnist_cnn.yaml");
  CHECK(c.model.input_shape == std::vector<std::int64_t>{1, 28, 28});
  CHECK(c.model.sequential.size() == 12);
  CHECK(c.model.classes == 10);
  CHECK(c.optim.lr == 0.01);
  CHECK(c.optim.momentum == 0.5);
  CHECK(c.data.batch_size == 64);
  const auto p = app::trainer_spec(c, 640, 200, ProgramTarget::cpu).program;
  std::vector<std::pair<std::string, Shape>> params;
  for (const auto& i : p.init) params.emplace_back(i.name, i.shape);
  CHECK(params == std::vector<std::pair<std::string, Shape>>{{"w1", {10, 1, 5, 5}}, {"b1", {10}},
                                                               {"w2", {20, 10, 5, 5}}, {"b2", {20}},
                                                               {"w3", {50, 320}},      {"b3", {50}},
                                                               {"w4", {10, 50}},       {"b4", {10}}});
  CHECK(needs_cnn_lowerings(c.model.input_shape, app::sequential_training(c).model.layers));
#ifdef STEPGRAPH_HAVE_CUDNN
  CHECK_NOTHROW(app::check_cuda_can_run(c));  // the cuDNN lowerings take the convolutions
#else
  CHECK_THROWS_WITH_AS(app::check_cuda_can_run(c), doctest::Contains("need cuDNN 9"), app::ConfigError);
  // backend.kind cuda stops before training, GPU or not.
  const auto out = test::fresh_dir("stepgraph-cnn-cuda");
  CHECK_THROWS_WITH_AS(app::run_training(cnn_config(out, {"backend.kind=cuda", "run.steps=1"})),
                       doctest::Contains("need cuDNN 9"), app::ConfigError);
  fs::remove_all(out);
#endif
  // A Sequential MLP has the MLP's graph: the CUDA backend takes it with or without cuDNN.
  CHECK_NOTHROW(app::check_cuda_can_run(parse("model:\n  input: [16]\n  sequential:\n    - linear: {out: 3}\n")));
}

TEST_CASE("a CNN run (dropout2d and dropout on) resumes bit-exactly on the CPU: 20 steps == 10 + resume + 10") {
  const auto out = test::fresh_dir("stepgraph-cnn-resume");
  const auto summary =
      app::run_training(cnn_config(out / "a", {"run.steps=20", "run.checkpoint=" + (out / "a.sgck").string()}));
  CHECK(std::isfinite(summary.final_train_loss));
  app::run_training(cnn_config(out / "b", {"run.steps=10", "run.checkpoint=" + (out / "b.sgck").string()}));
  app::run_training(cnn_config(out / "c", {"run.steps=20", "run.resume=" + (out / "b.sgck").string(),
                                           "run.checkpoint=" + (out / "c.sgck").string()}));
  test::check_same_checkpoints(out / "a.sgck", out / "c.sgck", 20);
  // The layer list is part of the trajectory: resuming with another one is refused.
  CHECK_THROWS_WITH_AS(
      app::run_training(cnn_config(out / "d", {"run.steps=20", "run.resume=" + (out / "b.sgck").string(),
                                               "model.sequential=[{conv2d: {out: 10, kernel: 5}}, {max_pool2d: "
                                               "{kernel: 4}}, relu, flatten, {linear: {out: 10}}]"})),
      doctest::Contains("model.sequential is"), app::ConfigError);
  fs::remove_all(out);
}

TEST_CASE("two dropout layers after the same layer draw different masks (distinct Philox streams)") {
  const auto c = parse(
      "model:\n  input: [16]\n  sequential:\n    - linear: {out: 8}\n    - relu\n    - dropout: {p: 0.5}\n"
      "    - dropout: {p: 0.5}\n    - linear: {out: 3}\n");
  const Graph g = build_sequential_forward(app::sequential_training(c).model);
  std::vector<std::int64_t> streams;
  for (const Node& n : g.nodes())
    if (n.op == OpKind::dropout) streams.push_back(n.attr<DropoutAttrs>().stream);
  REQUIRE(streams.size() == 2);
  // Philox keys on the stream's low 32 bits only (ops/philox.hpp).
  CHECK(static_cast<std::uint32_t>(streams[0]) != static_cast<std::uint32_t>(streams[1]));
}
