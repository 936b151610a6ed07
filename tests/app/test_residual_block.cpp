// Issue 37's short form of a residual block in model.sequential:
//   - residual: {layers: [...], projection: {conv2d: {...}}, name: block}
// is the layers it stands for (apps/config/sequential_layers.hpp): the body
// on the block's input, the projection (if any) on the same input, and an
// add of the two branches. It must train exactly as the long form a user
// would write with names and inputs, name where a problem is in its errors
// (file, line, the path inside the block), and round-trip through the
// resolved config.
#include <doctest/doctest.h>

#include <random>

#include "apps/backend_choice.hpp"
#include "apps/config/sequential_layers.hpp"
#include "apps/config/train_config.hpp"
#include "tests/app/residual_models.hpp"
#include "tests/support/error_text.hpp"
#include "tests/support/training_helpers.hpp"

using namespace sg;

namespace {

const char* kShortMlp =
    "model:\n  input: [20]\n  sequential:\n"
    "    - linear: {out: 16}\n"
    "    - residual:\n"
    "        layers: [relu, {linear: {out: 16}}]\n"
    "    - relu\n"
    "    - linear: {out: 5}\n";

// A block with a projection (stride 2, 4 -> 8 channels), named.
const char* kShortCnn =
    "model:\n  input: [1, 6, 6]\n  sequential:\n"
    "    - conv2d: {out: 4, kernel: 3, padding: 1}\n"
    "    - relu\n"
    "    - residual:\n"
    "        layers:\n"
    "          - conv2d: {out: 8, kernel: 3, padding: 1, stride: 2}\n"
    "          - relu\n"
    "          - conv2d: {out: 8, kernel: 3, padding: 1}\n"
    "        projection: {conv2d: {out: 8, kernel: 1, stride: 2}}\n"
    "        name: block1\n"
    "    - relu\n"
    "    - flatten\n"
    "    - linear: {out: 3}\n";

// The same network written out with names and inputs.
const char* kLongCnn =
    "model:\n  input: [1, 6, 6]\n  sequential:\n"
    "    - conv2d: {out: 4, kernel: 3, padding: 1}\n"
    "    - relu: {name: a}\n"
    "    - conv2d: {out: 8, kernel: 3, padding: 1, stride: 2}\n"
    "    - relu\n"
    "    - conv2d: {out: 8, kernel: 3, padding: 1, name: body}\n"
    "    - conv2d: {out: 8, kernel: 1, stride: 2, inputs: [a], name: proj}\n"
    "    - add: {inputs: [body, proj], name: block1}\n"
    "    - relu\n"
    "    - flatten\n"
    "    - linear: {out: 3}\n";

std::string error_of(const std::string& model_yaml) {
  return test::error_of([&] { test::parse_model(model_yaml); });
}

void check_has(const std::string& message, std::initializer_list<const char*> parts) {
  INFO(message);
  for (const char* p : parts) CHECK(message.find(p) != std::string::npos);
}

}  // namespace

TEST_CASE("a residual block expands into its layers, its projection and the add, each with its path") {
  const auto c = test::parse_model(kShortCnn);
  REQUIRE(c.model.sequential.size() == 6);
  CHECK(c.model.classes == 3);
  const app::ExpandedLayers x = app::expand_layers(c.model.sequential);
  REQUIRE(x.specs.size() == 10);
  CHECK(x.specs[1].name == "sequential[2].residual.input");  // the block's input, named for the add
  CHECK(x.specs[2].inputs == std::vector<std::string>{"sequential[2].residual.input"});
  CHECK(x.paths[2] == "model.sequential[2].residual.layers[0].conv2d");
  CHECK(x.specs[4].name == "sequential[2].residual.body");
  CHECK(x.specs[5].kind == LayerKind::conv2d);
  CHECK(x.specs[5].inputs == std::vector<std::string>{"sequential[2].residual.input"});
  CHECK(x.paths[5] == "model.sequential[2].residual.projection.conv2d");
  CHECK(x.specs[6].kind == LayerKind::add);
  CHECK(x.specs[6].name == "block1");
  CHECK(x.specs[6].inputs ==
        std::vector<std::string>{"sequential[2].residual.body", "sequential[2].residual.projection"});
  CHECK(x.paths[6] == "model.sequential[2].residual");
  CHECK(x.entries == std::vector<std::size_t>{0, 1, 2, 2, 2, 2, 2, 3, 4, 5});
  // Without a projection the add reads the block's input; a first block reads the model's input.
  const auto first = app::expand_layers(
      test::parse_model("model:\n  input: [8]\n  sequential:\n    - residual: {layers: [{linear: {out: 8}}, relu]}\n"
                        "    - linear: {out: 3}\n")
          .model.sequential);
  REQUIRE(first.specs.size() == 4);
  CHECK(first.specs[0].inputs == std::vector<std::string>{"input"});
  CHECK(first.specs[2].inputs == std::vector<std::string>{"sequential[0].residual.body", "input"});
}

TEST_CASE("a residual block trains exactly as the network written out with names and inputs") {
  std::mt19937_64 rng(371);
  for (const auto& [short_yaml, long_yaml, features, classes] :
       {std::tuple{kShortCnn, kLongCnn, std::int64_t{36}, std::int64_t{3}},
        std::tuple{kShortMlp, test::kResidualMlp, std::int64_t{20}, std::int64_t{5}}}) {
    CAPTURE(short_yaml);
    const Dataset data = test::random_dataset(64, features, classes, rng);
    const auto trainer = [&](const char* yaml) {
      const auto c = test::parse_model(yaml);
      return make_cpu_trainer(app::trainer_spec(c, data.train.images.count, data.test.images.count, ProgramTarget::cpu),
                              data);
    };
    const auto a = trainer(short_yaml), b = trainer(long_yaml);
    test::check_same_state(*a, *b);  // the same parameters, drawn alike
    const auto la = test::losses(*a, 12), lb = test::losses(*b, 12);
    CHECK(la == lb);
    test::check_same_state(*a, *b);
    CHECK(std::isfinite(la.back()));
  }
}

TEST_CASE("blocks nest, read a named input, and round-trip through the resolved config") {
  const std::string nested =
      "model:\n  input: [12]\n  sequential:\n"
      "    - linear: {out: 12, name: stem}\n"
      "    - relu: {name: act}\n"
      "    - residual:\n"
      "        inputs: [stem]\n"
      "        layers:\n"
      "          - residual: {layers: [{linear: {out: 12}}, tanh]}\n"
      "          - linear: {out: 12}\n"
      "        name: outer\n"
      "    - add: {inputs: [outer, act]}\n"
      "    - linear: {out: 4}\n";
  const auto c = test::parse_model(nested);
  const auto again = app::parse_config(app::to_yaml(c), "resolved.yaml");
  CHECK(again.model.sequential == c.model.sequential);
  CHECK(app::layer_text(c.model.sequential[2]) ==
        "residual{layers: [residual{layers: [linear{out: 12}, tanh{}]}, linear{out: 12}], name: outer, inputs: [stem]}");
  const app::ExpandedLayers x = app::expand_layers(c.model.sequential);
  REQUIRE(x.specs.size() == 9);  // stem, act, (linear, tanh, add), linear, add 'outer', add, linear
  CHECK(x.specs[2].inputs == std::vector<std::string>{"stem"});  // the inner block's body reads the outer's input
  CHECK(x.specs[4].inputs == std::vector<std::string>{"sequential[2].residual.layers[0].residual.body", "stem"});
  CHECK(x.specs[6].inputs == std::vector<std::string>{"sequential[2].residual.body", "stem"});
  CHECK(x.specs[6].name == "outer");
  std::mt19937_64 rng(5);
  const Dataset data = test::random_dataset(32, 12, 4, rng);
  auto t = make_cpu_trainer(app::trainer_spec(c, data.train.images.count, data.test.images.count, ProgramTarget::cpu),
                            data);
  const auto l = test::losses(*t, 5);
  CHECK(std::isfinite(l.back()));
}

TEST_CASE("a bad residual block is one clear error naming the file, line and the layer inside the block") {
  const std::string head = "model:\n  input: [4, 6, 6]\n  sequential:\n    - conv2d: {out: 4, kernel: 3, padding: 1}\n";
  // 8 channels at half the size added to the block's 4x6x6 input: a projection is needed.
  check_has(error_of(head + "    - residual:\n        layers: [{conv2d: {out: 8, kernel: 3, padding: 1, stride: 2}}]\n"
                            "    - flatten\n    - linear: {out: 3}\n"),
            {"graph.yaml:5:", "model.sequential[1].residual:", "adds [8,3,3]", "and [4,6,6]", "the shapes must agree"});
  // A layer inside the block that does not fit its input names its own path.
  check_has(error_of(head + "    - residual:\n        layers: [{max_pool2d: {kernel: 9}}]\n    - flatten\n"
                            "    - linear: {out: 3}\n"),
            {"graph.yaml:5:", "model.sequential[1].residual.layers[0].max_pool2d"});
  check_has(error_of(head + "    - residual: {}\n    - flatten\n    - linear: {out: 3}\n"),
            {"graph.yaml:5:", "model.sequential[1].residual.layers", "is required for residual"});
  check_has(error_of(head + "    - residual: {layers: []}\n    - flatten\n    - linear: {out: 3}\n"),
            {"model.sequential[1].residual.layers", "needs at least one layer"});
  check_has(error_of(head + "    - residual: {layers: [relu], projection: {residual: {layers: [relu]}}}\n"),
            {"model.sequential[1].residual.projection", "is one layer"});
  check_has(error_of(head + "    - residual: {layers: [relu], inputs: [a, b]}\n"),
            {"model.sequential[1].residual.inputs", "reads one input"});
  check_has(error_of(head + "    - residual: {layers: [relu], depth: 2}\n"),
            {"model.sequential[1].residual.depth", "unknown option (known here: layers, projection, name, inputs)"});
  std::string deep = "relu";
  for (int i = 0; i < 9; ++i) deep = "{residual: {layers: [" + deep + "]}}";
  check_has(error_of(head + "    - " + deep + "\n"), {"residual blocks nested 9 deep; at most 8"});
}
