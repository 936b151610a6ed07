// Issue 37's data.augment (translate, flip) from the config to the graphs:
// the training graph augments the fetched images right after their reshape,
// with the fill a raw 0 pixel gets, the run's seed and each rank's example
// offset; the eval and predict graphs never augment; a CPU run with
// augmentation resumes bit-exactly and trains differently from one without;
// bad settings are one clear error; the keys round-trip.
#include <doctest/doctest.h>

#include <random>

#include "apps/backend_choice.hpp"
#include "apps/config/train_config.hpp"
#include "models/sequential.hpp"
#include "tests/support/error_text.hpp"
#include "tests/support/training_helpers.hpp"

using namespace sg;

namespace {

const char* kCnn =
    "model:\n  input: [1, 8, 8]\n  sequential:\n"
    "    - conv2d: {out: 4, kernel: 3, padding: 1}\n    - relu\n    - max_pool2d: {kernel: 2}\n"
    "    - flatten\n    - linear: {out: 3}\n"
    "data:\n  batch_size: 16\n  normalize: true\n  augment: {translate: 2, flip: true}\n"
    "optim:\n  lr: 0.05\n  momentum: 0.9\nrun:\n  steps: 10\n  seed: 4\n"
    "precision:\n  weights: fp32\nbackend:\n  kind: cpu\n";

app::TrainConfig parse(const std::string& yaml, std::vector<std::string> overrides = {}) {
  return app::parse_config(yaml, "augment.yaml", overrides);
}

std::vector<const Node*> augment_nodes(const Graph& g) {
  std::vector<const Node*> out;
  for (const Node& n : g.nodes())
    if (n.op == OpKind::augment_images) out.push_back(&n);
  return out;
}

}  // namespace

TEST_CASE("data.augment puts one augment_images after the training batch's reshape, and none in eval or predict") {
  const auto c = parse(kCnn);
  CHECK(c.data.augment_translate == 2);
  CHECK(c.data.augment_flip);
  const SequentialSpec spec = app::sequential_training(c).model;
  const Graph train = build_sequential_forward(spec);
  const auto nodes = augment_nodes(train);
  REQUIRE(nodes.size() == 1);
  const auto& a = nodes.front()->attr<AugmentAttrs>();
  CHECK(a.translate == 2);
  CHECK(a.flip);
  CHECK(a.fill == doctest::Approx(-0.1307 / 0.3081));  // raw 0 after (x / 255 - mean) / std
  CHECK(a.seed == spec.dropout_seed);
  CHECK(a.example_offset == 0);
  CHECK(train.node(train.value(nodes.front()->inputs[0]).producer).op == OpKind::reshape);
  CHECK(augment_nodes(build_sequential_eval(spec)).empty());
  CHECK(augment_nodes(build_sequential_predict(spec)).empty());
  // Rank 1 of 2 draws for the global batch's second half.
  SequentialSpec rank1 = spec;
  rank1.batch_rank = 1;
  rank1.batch_ranks = 2;
  CHECK(augment_nodes(build_sequential_forward(rank1)).front()->attr<AugmentAttrs>().example_offset == 16);
  // Off by default: no node.
  CHECK(augment_nodes(build_sequential_forward(app::sequential_training(
                          parse(kCnn, {"data.augment.translate=0", "data.augment.flip=false"})).model))
            .empty());
}

TEST_CASE("a CPU run with augmentation resumes bit-exactly and differs from one without") {
  std::mt19937_64 rng(37);
  const Dataset data = test::random_dataset(96, 64, 3, rng);
  const auto c = parse(kCnn);
  std::string note;
  const auto trainer = [&](const app::TrainConfig& config) { return app::make_trainer(config, data, note); };
  auto straight = trainer(c);
  straight->train(12);
  auto first = trainer(c);
  first->train(5);
  const auto saved = first->save_state();
  auto resumed = trainer(c);
  resumed->load_state(saved);
  resumed->train(7);
  test::check_same_state(*straight, *resumed);
  auto plain = trainer(parse(kCnn, {"data.augment.translate=0", "data.augment.flip=false"}));
  plain->train(12);
  CHECK(test::all_parameters(*plain) != test::all_parameters(*straight));
}

TEST_CASE("bad data.augment settings are one clear error naming the key") {
  const auto error_of = [](const std::string& yaml, std::vector<std::string> overrides) {
    return test::error_of([&] { parse(yaml, overrides); });
  };
  CHECK(error_of(kCnn, {"data.augment.translate=8"}).find("data.augment.translate: must be in [0, 8) for [1,8,8] images") !=
        std::string::npos);
  CHECK(error_of(kCnn, {"data.augment.translate=-1"}).find("data.augment.translate: must be in [0, 8)") !=
        std::string::npos);
  const std::string mlp = "model:\n  layers: [64, 8, 3]\ndata:\n  augment: {flip: true}\n";
  CHECK(error_of(mlp, {}).find("data.augment.flip: augments images: it needs model.sequential with model.input [C, H, W]") !=
        std::string::npos);
  CHECK(error_of(kCnn, {"data.augment.rotate=10"}).find("data.augment.rotate") != std::string::npos);
}

TEST_CASE("data.augment round-trips through the resolved config") {
  const auto c = parse(kCnn);
  const auto again = app::parse_config(app::to_yaml(c), "resolved.yaml");
  CHECK(again.data.augment_translate == 2);
  CHECK(again.data.augment_flip);
  CHECK(app::to_yaml(again) == app::to_yaml(c));
}
