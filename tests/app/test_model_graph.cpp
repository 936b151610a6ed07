// Issue 37's model graph (models/layer_graph.hpp): model.sequential layers
// that name the earlier layers they read (`name:`, `inputs:`) and `add`
// merges, e.g. residual connections. Bad graphs are one clear error naming
// the file, line, layer and shapes; a residual network builds the graph with
// its add nodes, its gradients through the shared input match central
// differences, it learns on the CPU backend, round-trips through the
// resolved config, and the CUDA core lowerings cover its graph.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>

#include "apps/backend_choice.hpp"
#include "apps/config/train_config.hpp"
#include "graph/autodiff.hpp"
#include "models/layer_graph.hpp"
#include "runtime/export/exported_graph.hpp"
#include "runtime/plan/schedule.hpp"
#include "tests/app/residual_models.hpp"
#include "tests/runtime/finite_differences.hpp"
#include "tests/runtime/test_support.hpp"
#include "tests/support/error_text.hpp"
#include "tests/support/training_helpers.hpp"
#ifdef STEPGRAPH_HAVE_CUDA
#include "runtime/cuda/lowering.hpp"
#endif

using namespace sg;

namespace {

using test::kBatchNormCnn;
using test::kBiasFreeCnn;
using test::kBranchedCnn;
using test::kNormedResidualMlp;
using test::kPooledResidualCnn;
using test::kResidualCnn;
using test::kResidualMlp;

app::TrainConfig parse(const std::string& model_yaml) { return test::parse_model(model_yaml); }

std::string error_of(const std::string& model_yaml) {
  return test::error_of([&] { parse(model_yaml); });
}

}  // namespace

TEST_CASE("bad model graphs give one clear error naming the file, line, layer and shapes") {
  const auto has = [](const std::string& message, std::initializer_list<const char*> parts) {
    INFO(message);
    for (const char* p : parts) CHECK(message.find(p) != std::string::npos);
  };
  const std::string head = "model:\n  input: [1, 8, 8]\n  sequential:\n";
  // An add of 4x8x8 and 2x8x8.
  has(error_of(head + "    - conv2d: {out: 4, kernel: 3, padding: 1, name: a}\n"
                      "    - conv2d: {out: 2, kernel: 3, padding: 1, name: b}\n"
                      "    - add: {inputs: [a, b]}\n    - flatten\n    - linear: {out: 3}\n"),
      {"graph.yaml:6:", "model.sequential[2].add", "adds [4,8,8] (layer 0 'a') and [2,8,8] (layer 1 'b')",
       "the shapes must agree"});
  // A concat of 4x8x8 and 2x4x4 (channels may differ, the rest may not), and of one input.
  has(error_of(head + "    - conv2d: {out: 4, kernel: 3, padding: 1, name: a}\n"
                      "    - max_pool2d: {kernel: 2, inputs: [input], name: b}\n"
                      "    - concat: {inputs: [a, b]}\n    - flatten\n    - linear: {out: 3}\n"),
      {"graph.yaml:6:", "model.sequential[2].concat", "joins [4,8,8] (layer 0 'a') and [1,4,4] (layer 1 'b')",
       "all but the first dimension must agree"});
  has(error_of(head + "    - flatten: {name: f}\n    - concat: {inputs: [f]}\n    - linear: {out: 3}\n"),
      {"graph.yaml:5:", "model.sequential[1].concat", "joins two or more inputs"});
  // A layer reading a later one (what a cycle would need).
  has(error_of(head + "    - flatten: {inputs: [z]}\n    - linear: {out: 3, name: z}\n"),
      {"graph.yaml:4:", "model.sequential[0].flatten", "input 'z' is layer 1, after this one", "no cycles"});
  has(error_of(head + "    - flatten: {name: f, inputs: [f]}\n    - linear: {out: 3}\n"),
      {"model.sequential[0].flatten", "input 'f' is layer 0, that is this one"});
  // An unknown input name lists the names it may use.
  has(error_of(head + "    - flatten: {name: f}\n    - linear: {out: 3, inputs: [g]}\n"),
      {"graph.yaml:5:", "model.sequential[1].linear", "input 'g' names no layer", "input, 'f'"});
  // A layer no later layer reads.
  has(error_of(head + "    - flatten: {name: f}\n    - linear: {out: 8}\n    - linear: {out: 3, inputs: [f]}\n"),
      {"graph.yaml:5:", "model.sequential[1].linear", "no layer reads its output"});
  // Names: used twice, or the model input's.
  has(error_of(head + "    - flatten: {name: f}\n    - linear: {out: 3, name: f}\n"),
      {"graph.yaml:5:", "model.sequential[1].linear", "name 'f' is already layer 0's"});
  has(error_of(head + "    - flatten: {name: input}\n    - linear: {out: 3}\n"),
      {"model.sequential[0].flatten", "name 'input' is the model's input"});
  // Arity.
  has(error_of(head + "    - flatten: {name: f}\n    - add: {inputs: [f]}\n    - linear: {out: 3}\n"),
      {"graph.yaml:5:", "model.sequential[1].add", "adds two or more inputs"});
  has(error_of(head + "    - flatten: {name: f}\n    - linear: {out: 3, inputs: [f, f]}\n"),
      {"model.sequential[1].linear", "reads one input; it lists 2"});
  // Option spelling.
  has(error_of(head + "    - flatten\n    - add: {input: [f]}\n"),
      {"graph.yaml:5:", "model.sequential[1].add.input", "add takes only name and inputs"});
  has(error_of(head + "    - flatten: {inputs: {a: 1}}\n    - linear: {out: 3}\n"),
      {"model.sequential[0].flatten.inputs", "a layer name or a list of them"});
}

TEST_CASE("a residual MLP builds its add nodes, keeps the chain's parameters, and round-trips") {
  const auto ok = parse(kResidualMlp);
  REQUIRE(ok.model.sequential.size() == 6);
  CHECK(ok.model.sequential[0].name == "h");
  CHECK(ok.model.sequential[3].inputs == std::vector<std::string>{"h", "r"});
  CHECK(ok.model.classes == 5);
  const auto again = app::parse_config(app::to_yaml(ok), "resolved.yaml");
  CHECK(again.model.sequential == ok.model.sequential);
  CHECK(app::layer_text(ok.model.sequential[3]) == "add{inputs: [h, r]}");
  CHECK(app::layer_text(ok.model.sequential[0]) == "linear{out: 16, name: h}");
  // A list index is no name.
  std::string by_index = kResidualMlp;
  by_index.replace(by_index.find("[h, r]"), 6, "[h, 2]");
  CHECK(error_of(by_index).find("input '2' names no layer") != std::string::npos);

  const auto program = app::trainer_spec(ok, 64, 32, ProgramTarget::cpu).program;
  const Graph& g = program.train;
  const auto adds = std::count_if(g.nodes().begin(), g.nodes().end(), [](const Node& n) { return n.op == OpKind::add; });
  CHECK(adds >= 2);  // the residual add, and autodiff's sum of h's two gradients
  // The parameters are the chain's (w1..w3, b1..b3), drawn as for the list without the add.
  REQUIRE(program.init.size() == 6);
  CHECK(program.init[2].name == "w2");
  CHECK(program.init[2].shape == Shape{16, 16});
  CHECK(program.init[4].shape == Shape{5, 16});
}

TEST_CASE("gradients through a residual add match central differences (f64)") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  Graph g;
  const ValueId x = g.input("x", {3, 5}, DType::f32);
  const ValueId h = g.append_node(OpKind::relu, {g.linear(x, g.param("w1", {6, 5}, DType::f32),
                                                           g.param("b1", {6}, DType::f32))},
                                  NoAttrs{})
                        .front();
  const ValueId r = g.linear(h, g.param("w2", {6, 6}, DType::f32), g.param("b2", {6}, DType::f32));
  const ValueId sum = g.append_node(OpKind::add, {h, r}, NoAttrs{}).front();  // h is read twice
  const ValueId logits = g.linear(sum, g.param("w3", {4, 6}, DType::f32), g.param("b3", {4}, DType::f32));
  const ValueId loss = g.softmax_xent(logits, g.label("labels", {3}, DType::i32));
  const auto grads = append_backward(g, loss);
  CpuExecutor<double> exec(g);
  for (const auto& v : g.values()) {
    if (v.role == Role::param || v.role == Role::input) sg::test::fill_uniform(exec.tensor(v.id).real, rng);
    if (v.role == Role::label)
      for (auto& y : exec.tensor(v.id).i32) y = static_cast<std::int32_t>(rng() % 4);
  }
  exec.run();
  const auto analytic = sg::test::analytic_gradients(exec, grads);
  REQUIRE(analytic.size() == 6);
  for (const auto& [param, values] : analytic) {
    INFO("parameter " << g.value(param).name);
    CHECK(sg::test::relative_error(values, sg::test::numeric_gradient(exec, param, loss)) < 1e-6);
  }
}

// (The pooled CNN's global mean leaves 6 features: too few to memorise
// random labels. It learns real patches in test_predict_sequential.)
TEST_CASE("residual MLPs (one with layer_norm), residual CNNs (one with batch_norm) and a CNN joining branches learn "
          "on the CPU backend") {
  std::mt19937_64 rng(37);
  for (const auto& [yaml, features, classes] : {std::tuple{kResidualMlp, std::int64_t{20}, std::int64_t{5}},
                                                std::tuple{kNormedResidualMlp, std::int64_t{20}, std::int64_t{5}},
                                                std::tuple{kResidualCnn, std::int64_t{36}, std::int64_t{3}},
                                                std::tuple{kBranchedCnn, std::int64_t{64}, std::int64_t{3}},
                                                std::tuple{kBatchNormCnn, std::int64_t{64}, std::int64_t{3}},
                                                std::tuple{kBiasFreeCnn, std::int64_t{64}, std::int64_t{3}}}) {
    const auto c = parse(yaml);
    const Dataset data = test::random_dataset(64, features, classes, rng);  // memorised: random labels
    TrainerSpec spec = app::trainer_spec(c, data.train.images.count, data.test.images.count, ProgramTarget::cpu);
    auto trainer = make_cpu_trainer(spec, data);
    const auto l = test::losses(*trainer, 120);
    double first = 0, last = 0;
    for (int i = 0; i < 8; ++i) {
      first += l[static_cast<std::size_t>(i)] / 8;
      last += l[l.size() - 1 - static_cast<std::size_t>(i)] / 8;
    }
    INFO(yaml << "mean loss of the first 8 steps " << first << ", of the last 8 " << last);
    CHECK(std::isfinite(last));
    CHECK(last < 0.7 * first);
  }
}

TEST_CASE("the printed PyTorch module runs concat, the poolings and LayerNorm as their torch calls") {
  exporting::ExportedGraph m;
  m.input_shape = {1, 8, 8};
  const auto layer = [&](std::string kind, std::vector<int> inputs) {
    exporting::GraphLayer l;
    l.kind = std::move(kind);
    l.inputs = std::move(inputs);
    m.layers.push_back(l);
    return static_cast<int>(m.layers.size()) - 1;
  };
  const int stem = layer("relu", {-1});
  m.layers[static_cast<std::size_t>(layer("avg_pool2d", {stem}))].kernel = 2;
  m.layers.back().stride = 2;
  const int norm = layer("layer_norm", {1});
  m.layers.back().weight_shape = {1, 4, 4};
  m.layers.back().eps = 0.001;
  layer("concat", {norm, 1, norm});
  layer("global_avg_pool2d", {3});
  const std::string code = exporting::torch_module_code(m);
  INFO(code);
  for (const char* line : {"h0 = F.relu(x)", "h1 = F.avg_pool2d(h0, kernel_size=2, stride=2)",
                           "self.layer2 = nn.LayerNorm([1, 4, 4], eps=0.001)", "h2 = self.layer2(h1)",
                           "h3 = torch.cat([h2, h1, h2], 1)", "h4 = torch.flatten(F.adaptive_avg_pool2d(h3, 1), 1)",
                           "return h4"})
    CHECK(code.find(line) != std::string::npos);
}

#ifdef STEPGRAPH_HAVE_CUDA
TEST_CASE("the CUDA lowerings cover a residual network's training and eval graphs (no GPU needed)") {
  for (const char* yaml :
       {kResidualMlp, kResidualCnn, kPooledResidualCnn, kNormedResidualMlp, kBranchedCnn, kBatchNormCnn, kBiasFreeCnn}) {
  const auto program = app::trainer_spec(parse(yaml), 640, 320, ProgramTarget::cuda).program;
  for (const bool core_only : {false, true}) {
    BackendOptions options;
    options.core_only = core_only;
    const auto lowerings = cuda::cuda_lowerings(options, /*device_present=*/false);
    for (const Graph* g : {&program.train, &program.eval}) {
      CAPTURE(core_only);
      Schedule s;
      REQUIRE_NOTHROW(s = build_schedule(*g, cuda::as_lowerings(lowerings)));
      CHECK(s.launches.size() > 1);
    }
  }
  }
}
#endif
