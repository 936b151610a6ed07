// Issue 37's batch_norm layer in a model (models/sequential.cpp): the
// training graph updates running_mean<k> / running_var<k> (f32 state) once
// per step, the eval graph reads them as parameters of the same names, they
// start at 0 and 1 (nn.BatchNorm's), move with training, decide evaluation,
// and resume bit-exactly from a checkpoint with everything else. The config
// takes eps and momentum, refuses bad ones naming the key, and round-trips.
// Folding a batch_norm into the layer before it (export --fold-batch-norm)
// computes what the two layers did.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "apps/backend_choice.hpp"
#include "apps/config/train_config.hpp"
#include "runtime/export/batch_norm_folding.hpp"
#include "runtime/tensor_blob.hpp"
#include "tests/app/residual_models.hpp"
#include "tests/support/error_text.hpp"
#include "tests/support/training_helpers.hpp"

using namespace sg;

namespace {

const io::TensorBlob& entry(const std::vector<io::TensorBlob>& blobs, const std::string& name) {
  const auto it = std::find_if(blobs.begin(), blobs.end(), [&](const io::TensorBlob& b) { return b.name == name; });
  REQUIRE_MESSAGE(it != blobs.end(), "no state entry " << name);
  return *it;
}

std::int64_t count_ops(const Graph& g, OpKind op) {
  return std::count_if(g.nodes().begin(), g.nodes().end(), [&](const Node& n) { return n.op == op; });
}

}  // namespace

TEST_CASE("batch_norm layers: running statistics are training state, eval parameters, and start at 0 and 1") {
  const auto c = test::parse_model(test::kBatchNormCnn);
  const auto program = app::trainer_spec(c, 64, 32, ProgramTarget::cpu).program;
  // Four batch_norm layers: parameter layers 2, 4 and 6 (the block's two) and 7 (1d, before the classifier).
  CHECK(count_ops(program.train, OpKind::batch_norm) == 4);
  CHECK(count_ops(program.train, OpKind::batch_norm_stats_update) == 4);
  CHECK(count_ops(program.train, OpKind::batch_norm_backward) == 4);
  CHECK(count_ops(program.train, OpKind::batch_norm_inference) == 0);
  CHECK(count_ops(program.eval, OpKind::batch_norm_inference) == 4);
  CHECK(count_ops(program.eval, OpKind::batch_norm) == 0);
  for (const char* name : {"running_mean2", "running_var2", "running_mean7", "running_var7"}) {
    CAPTURE(name);
    CHECK(program.train.value(program.train.value_named(name)).role == Role::state);
    CHECK(program.eval.value(program.eval.value_named(name)).role == Role::param);
  }
  CHECK(program.train.value(program.train.value_named("running_var7")).shape == Shape{64});
  const auto init = [&](const std::string& name) {
    for (const auto& p : program.init)
      if (p.name == name) return p.values;
    FAIL("no initial values for " << name);
    return std::vector<float>{};
  };
  CHECK(init("running_mean2") == std::vector<float>(4, 0.f));
  CHECK(init("running_var2") == std::vector<float>(4, 1.f));
  CHECK(init("w2") == std::vector<float>(4, 1.f));  // gamma
  CHECK(init("b2") == std::vector<float>(4, 0.f));  // beta
  CHECK(shared_state_names(program) ==
        std::set<std::string>{"running_mean2", "running_mean4", "running_mean6", "running_mean7", "running_var2",
                              "running_var4", "running_var6", "running_var7"});
}

TEST_CASE("batch_norm's running statistics move with training, decide evaluation, and resume bit-exactly") {
  std::mt19937_64 rng(41);
  const Dataset data = test::random_dataset(96, 64, 3, rng);
  const auto c = test::parse_model(test::kBatchNormCnn);
  const auto spec = [&] { return app::trainer_spec(c, data.train.images.count, data.test.images.count, ProgramTarget::cpu); };

  auto straight = make_cpu_trainer(spec(), data);
  straight->train(8);
  const auto state = straight->save_state();
  const auto mean = floats_from_blob(entry(state, "running_mean7"));
  const auto var = floats_from_blob(entry(state, "running_var7"));
  CHECK(std::any_of(mean.begin(), mean.end(), [](float m) { return m != 0.f; }));
  CHECK(std::any_of(var.begin(), var.end(), [](float v) { return v != 1.f; }));
  CHECK(std::all_of(var.begin(), var.end(), [](float v) { return v > 0.f; }));

  // Evaluation reads them: other running statistics, another test loss; the
  // saved ones back, the same loss again.
  const auto before = straight->evaluate();
  auto changed = state;
  for (auto& b : changed)
    if (b.name.rfind("running_var", 0) == 0) {
      auto v = floats_from_blob(b);
      for (auto& x : v) x *= 9.f;
      b = blob_from_floats(b.name, b.shape, DType::f32, v);
    }
  straight->load_state(changed);
  CHECK(straight->evaluate().loss != before.loss);
  straight->load_state(state);
  CHECK(straight->evaluate().loss == before.loss);

  // 8 steps straight against 4, a checkpoint's state in a new trainer, 4 more.
  straight->train(4);
  auto first = make_cpu_trainer(spec(), data);
  first->train(4);
  auto second = make_cpu_trainer(spec(), data);
  second->load_state(first->save_state());
  second->train(4);
  second->load_state(second->save_state());  // (a round trip changes nothing)
  auto third = make_cpu_trainer(spec(), data);
  third->load_state(state);
  third->train(4);
  test::check_same_state(*straight, *third);
  auto again = make_cpu_trainer(spec(), data);
  again->train(8);
  test::check_same_state(*again, *second);
  CHECK(again->evaluate().loss == second->evaluate().loss);
}

TEST_CASE("batch_norm's config: eps and momentum, one clear error for bad ones, and the resolved config round-trips") {
  const auto ok = test::parse_model(test::kBatchNormCnn);
  const auto& block = ok.model.sequential;
  const auto bn = std::find_if(block.begin(), block.end(), [](const app::LayerConfig& l) { return l.kind == "batch_norm"; });
  REQUIRE(bn != block.end());
  CHECK(bn->eps == 1e-5);
  CHECK(bn->momentum == 0.1);
  CHECK(app::layer_text(block[block.size() - 2]) == "batch_norm{eps: 0.001, momentum: 0.1}");
  const auto again = app::parse_config(app::to_yaml(ok), "resolved.yaml");
  CHECK(again.model.sequential == ok.model.sequential);

  // Layers without a bias: no b<k>, the key in the resolved config only when false.
  const auto free = test::parse_model(test::kBiasFreeCnn);
  CHECK_FALSE(free.model.sequential[0].bias);
  CHECK(free.model.sequential.back().bias);
  CHECK(app::layer_text(free.model.sequential[0]) == "conv2d{out: 4, kernel: 3, stride: 1, padding: 1, bias: false}");
  CHECK(app::layer_text(free.model.sequential[4]) == "linear{out: 8, bias: false}");
  CHECK(app::layer_text(free.model.sequential[7]) == "linear{out: 3}");
  CHECK(app::parse_config(app::to_yaml(free), "resolved.yaml").model.sequential == free.model.sequential);
  const auto program = app::trainer_spec(free, 64, 32, ProgramTarget::cpu).program;
  std::vector<std::string> names;
  for (const auto& p : program.init) names.push_back(p.name);
  CHECK(names == std::vector<std::string>{"w1", "w2", "b2", "running_mean2", "running_var2", "w3", "w4", "b4",
                                          "running_mean4", "running_var4", "w5", "b5"});
  CHECK_FALSE(program.train.find_value("b1"));
  CHECK_FALSE(program.eval.find_value("b3"));

  const auto error_of = [](const std::string& layer) {
    return test::error_of([&] {
      test::parse_model("model:\n  input: [1, 8, 8]\n  sequential:\n    - conv2d: {out: 4, kernel: 3}\n    - " + layer +
                        "\n    - flatten\n    - linear: {out: 3}\n");
    });
  };
  const auto has = [](const std::string& message, std::initializer_list<const char*> parts) {
    INFO(message);
    for (const char* p : parts) CHECK(message.find(p) != std::string::npos);
  };
  has(error_of("batch_norm: {momentum: 1.5}"), {"graph.yaml:5:", "model.sequential[1].batch_norm.momentum", "must be in [0, 1]"});
  has(error_of("batch_norm: {eps: 0}"), {"graph.yaml:5:", "model.sequential[1].batch_norm.eps", "must be > 0"});
  has(error_of("batch_norm: {out: 4}"), {"model.sequential[1].batch_norm.out", "unknown option (known here: eps, momentum, name, inputs)"});
  has(error_of("relu: {bias: false}"), {"model.sequential[1].relu.bias", "unknown option"});
}

TEST_CASE("folding batch_norm into the conv2d / linear layer before it computes what the two layers did") {
  exporting::ExportedGraph m;
  m.input_shape = {3};
  exporting::GraphLayer linear;
  linear.kind = "linear";
  linear.inputs = {-1};
  linear.in = 3;
  linear.out = 2;
  linear.weight = {0.5f, -1.f, 2.f, 1.5f, 0.25f, -0.75f};
  linear.bias = {0.1f, -0.2f};
  exporting::GraphLayer bn;
  bn.kind = "batch_norm";
  bn.inputs = {0};
  bn.in = 2;
  bn.eps = 1e-3;
  bn.weight = {1.5f, 0.5f};
  bn.bias = {-0.25f, 0.75f};
  bn.running_mean = {0.3f, -0.4f};
  bn.running_var = {2.f, 0.25f};
  exporting::GraphLayer relu;
  relu.kind = "relu";
  relu.inputs = {1};
  exporting::GraphLayer pooled_bn = bn;  // reads the relu: stays
  pooled_bn.inputs = {2};
  m.layers = {linear, bn, relu, pooled_bn};
  const std::vector<double> x = {0.7, -1.1, 0.4};
  const auto two_layers = [&](std::size_t o) {
    double z = linear.bias[o];
    for (std::size_t k = 0; k < 3; ++k) z += double(linear.weight[o * 3 + k]) * x[k];
    return (z - bn.running_mean[o]) / std::sqrt(double(bn.running_var[o]) + bn.eps) * bn.weight[o] + bn.bias[o];
  };
  REQUIRE(exporting::fold_batch_norms(m) == 1);
  CHECK(m.layers[1].kind == "identity");
  CHECK(m.layers[1].inputs == std::vector<int>{0});
  CHECK(m.layers[3].kind == "batch_norm");
  for (std::size_t o = 0; o < 2; ++o) {
    double folded = m.layers[0].bias[o];
    for (std::size_t k = 0; k < 3; ++k) folded += double(m.layers[0].weight[o * 3 + k]) * x[k];
    CHECK(folded == doctest::Approx(two_layers(o)).epsilon(1e-6));
  }
  // A layer without a bias gains one.
  exporting::ExportedGraph bias_free = m;
  bias_free.layers = {linear, bn};
  bias_free.layers[0].bias.clear();
  REQUIRE(exporting::fold_batch_norms(bias_free) == 1);
  REQUIRE(bias_free.layers[0].bias.size() == 2);
  CHECK(bias_free.layers[0].bias_shape == std::vector<std::int64_t>{2});
  CHECK(bias_free.layers[0].bias[1] == doctest::Approx((0.0 - bn.running_mean[1]) / std::sqrt(0.25 + 1e-3) * 0.5 + 0.75));
  // A layer whose output another layer also reads keeps its batch_norm.
  exporting::ExportedGraph shared = m;
  shared.layers = {linear, bn, relu};
  shared.layers[2].inputs = {0};
  shared.layers.push_back(relu);
  shared.layers[3].inputs = {1, 2};
  shared.layers[3].kind = "add";
  CHECK(exporting::fold_batch_norms(shared) == 0);
}
