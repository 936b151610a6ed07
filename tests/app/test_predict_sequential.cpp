// `stepgraph predict` and `export` on every model (issue 37): a
// model.sequential checkpoint (a residual CNN, written with the residual:
// short form) is read back with its builder's parameter names and shapes,
// and predicts on the CPU backend what the run's own evaluation saw: the
// same accuracy on the same rows, probabilities that are the softmax of its
// logits. Its safetensors export is the state_dict of the PyTorch module
// whose code it prints (names, shapes, the checkpoint's values; the code
// parses as Python). PyTorch running it against predict is
// bench/export_roundtrip.py's, on the GPU image. Its ONNX export passes
// the ONNX checker with the expected inputs, outputs and ops (onnxruntime
// running it: export_roundtrip.py again). A CNN with avg_pool2d and global
// average pooling (issue 37's poolings) learns bars wherever they lie, and
// goes through predict and both exports the same way; one with batch_norm
// (after a conv without bias) predicts with its running statistics and
// exports them as nn.BatchNorm's buffers (and ONNX BatchNormalization), or
// folded into the conv.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <cstdlib>
#include <cstring>
#include <random>

#include <nlohmann/json.hpp>

#include "apps/config/train_config.hpp"
#include "apps/export_command.hpp"
#include "apps/predict_command.hpp"
#include "apps/saved_model.hpp"
#include "apps/training_run.hpp"
#include "runtime/export/onnx_writer.hpp"
#include "runtime/io/atomic_file.hpp"
#include "runtime/tensor_blob.hpp"
#include "runtime/data/npy_array.hpp"
#include "tests/support/error_text.hpp"
#include "tests/support/npy_files.hpp"
#include "tests/support/safetensors_file.hpp"
#include "tests/support/temp_files.hpp"

#ifdef STEPGRAPH_HAVE_ONNX
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#endif

using namespace sg;
namespace fs = std::filesystem;

namespace {

// 1x6x6 images of three classes: a bright 3x3 patch in one of three corners, with noise.
struct Patches {
  std::int64_t n = 0;
  std::vector<float> x;
  std::vector<std::int64_t> y;
};

Patches make_patches(std::int64_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> noise(0.f, 0.3f);
  Patches p{n, {}, {}};
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t c = i % 3;
    const int r0 = c == 2 ? 3 : 0, c0 = c == 1 ? 3 : 0;
    for (int r = 0; r < 6; ++r)
      for (int k = 0; k < 6; ++k) p.x.push_back((r >= r0 && r < r0 + 3 && k >= c0 && k < c0 + 3 ? 1.f : 0.f) + noise(rng));
    p.y.push_back(c);
  }
  return p;
}

// 1x6x6 images of three classes at a random place: a horizontal bar of 3
// pixels, a vertical one, a diagonal one, with noise. Where the bar lies
// says nothing: a network with global average pooling learns these.
Patches make_bars(std::int64_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> noise(0.f, 0.3f);
  Patches p{n, {}, {}};
  for (std::int64_t i = 0; i < n; ++i) {
    const int c = static_cast<int>(i % 3);
    const int r0 = static_cast<int>(rng() % 4), c0 = static_cast<int>(rng() % 4);
    std::vector<float> image(36, 0.f);
    for (int k = 0; k < 3; ++k) {
      const int r = c == 0 ? r0 + 1 : r0 + k, col = c == 1 ? c0 + 1 : c0 + k;
      image[static_cast<std::size_t>(r * 6 + col)] = 1.f;
    }
    for (float v : image) p.x.push_back(v + noise(rng));
    p.y.push_back(c);
  }
  return p;
}

// The rows' class probabilities (or logits) from a predict run.
std::vector<double> predict(const fs::path& dir, const std::string& output) {
  app::PredictRequest p;
  p.checkpoint = (dir / "model.sgck").string();
  p.input = (dir / "xt.npy").string();
  p.out = (dir / ("preds_" + output + ".npy")).string();
  p.backend = "cpu";
  p.batch_size = 16;  // 60 rows: the last batch is padded
  p.output = output;
  REQUIRE(app::run_predict(p) == 0);
  const auto preds = data::read_npy(p.out);
  REQUIRE(preds.shape == std::vector<std::int64_t>{60, 3});
  std::vector<double> v;
  for (std::int64_t i = 0; i < 60 * 3; ++i) v.push_back(data::npy_element(preds, i));
  return v;
}

using sg::test::read_safetensors;
using sg::test::SafetensorsFile;

// `stepgraph export` of dir/model.sgck as dir/<file> (safetensors; `fold`: --fold-batch-norm), read back.
SafetensorsFile export_safetensors(const fs::path& dir, const std::string& file, bool fold = false) {
  const app::ExportRequest e{(dir / "model.sgck").string(), "safetensors", (dir / file).string(), fold};
  REQUIRE(app::run_export(e) == 0);
  return read_safetensors(dir / file);
}

// The expanded layers: 0 conv, 1 relu (the block's input), 2 conv, 3 relu,
// 4 conv (the body), 5 add, 6 relu, 7 max-pool, 8 flatten, 9 linear.
void check_safetensors_export(const fs::path& dir, const app::SavedModel& saved) {
  const SafetensorsFile st = export_safetensors(dir, "model.safetensors");
  const auto& header = st.header;
  const std::string code = st.module_code();
  INFO(code);
  for (const char* line : {"class StepgraphNet(nn.Module):", "self.layer0 = nn.Conv2d(1, 4, kernel_size=3, stride=1, padding=1)",
                           "self.layer9 = nn.Linear(36, 3)", "h0 = self.layer0(x)", "h2 = self.layer2(h1)",
                           "h5 = h4 + h1", "h7 = F.max_pool2d(h6, kernel_size=2, stride=2)", "h8 = torch.flatten(h7, 1)",
                           "return h9", "def forward(self, x):  # x: [N, 1, 6, 6]"})
    CHECK(code.find(line) != std::string::npos);
  // Each tensor: the module's name, its shape, the checkpoint's values (w1, b1, ... in layer order).
  const std::vector<std::pair<std::string, std::vector<std::int64_t>>> tensors = {
      {"layer0.weight", {4, 1, 3, 3}}, {"layer0.bias", {4}}, {"layer2.weight", {4, 4, 3, 3}}, {"layer2.bias", {4}},
      {"layer4.weight", {4, 4, 3, 3}}, {"layer4.bias", {4}}, {"layer9.weight", {3, 36}},      {"layer9.bias", {3}}};
  REQUIRE(saved.params.size() == tensors.size());
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const auto& [name, shape] = tensors[t];
    CAPTURE(name);
    REQUIRE(header.contains(name));
    CHECK(header[name]["shape"] == nlohmann::json(shape));
    CHECK(st.floats(name) == floats_from_blob(saved.params[t]));
  }
  // The printed code is Python (where a python3 is there to say so).
  test::write_file(dir / "module.py", code);
  if (std::system("python3 -c 'pass' > /dev/null 2>&1") != 0) {
    MESSAGE("no python3 here: the module's code was not parsed");
    return;
  }
  CHECK(std::system(("python3 -c \"import ast; ast.parse(open('" + (dir / "module.py").string() + "').read())\"").c_str()) == 0);
}

// Trains `layers` (model.sequential entries, one per line) on `images`' data
// with the CPU backend, checkpointing to dir/model.sgck; the held-out rows
// are dir/xt.npy (dir/yt.npy: their labels).
using Images = Patches (*)(std::int64_t, std::uint64_t);
app::TrainSummary train_on(Images images, const fs::path& dir, const std::string& layers, int epochs) {
  const Patches train = images(240, 1), held = images(60, 2);
  test::write_file(dir / "x.npy", test::npy_f32({train.n, 1, 6, 6}, train.x));
  test::write_file(dir / "y.npy", test::npy_i64({train.n}, train.y));
  test::write_file(dir / "xt.npy", test::npy_f32({held.n, 1, 6, 6}, held.x));
  test::write_file(dir / "yt.npy", test::npy_i64({held.n}, held.y));
  const std::string yaml = "model:\n  input: [1, 6, 6]\n  sequential:\n" + layers +
                           "data: {batch_size: 16, eval_batch_size: 30}\n"
                           "optim: {lr: 0.05, momentum: 0.9}\n"
                           "run: {epochs: " + std::to_string(epochs) + ", log_every: 1000}\n"
                           "backend: {kind: cpu}\n";
  const auto config = app::parse_config(
      yaml, "predict test",
      {"data.train_x=" + (dir / "x.npy").string(), "data.train_y=" + (dir / "y.npy").string(),
       "data.test_x=" + (dir / "xt.npy").string(), "data.test_y=" + (dir / "yt.npy").string(),
       "run.out_dir=" + (dir / "run").string(), "run.checkpoint=" + (dir / "model.sgck").string()});
  const auto summary = app::run_training(config);
  REQUIRE(summary.final_eval.examples == 60);
  return summary;
}

// Predict's probabilities are the softmax of its logits, and its top class
// hits as many held-out rows as the run's own evaluation did.
void check_predict_follows_evaluation(Images images, const fs::path& dir, const app::TrainSummary& summary) {
  const Patches held = images(60, 2);
  const auto probabilities = predict(dir, "probabilities"), logits = predict(dir, "logits");
  int hits = 0;
  for (std::int64_t i = 0; i < 60; ++i) {
    const double* p = &probabilities[static_cast<std::size_t>(i * 3)];
    const double* z = &logits[static_cast<std::size_t>(i * 3)];
    CHECK(p[0] + p[1] + p[2] == doctest::Approx(1.0).epsilon(1e-5));
    const double top = std::max({z[0], z[1], z[2]});
    const double sum = std::exp(z[0] - top) + std::exp(z[1] - top) + std::exp(z[2] - top);
    for (int c = 0; c < 3; ++c) CHECK(p[c] == doctest::Approx(std::exp(z[c] - top) / sum).epsilon(1e-5));
    const int arg = static_cast<int>(std::max_element(p, p + 3) - p);
    hits += arg == held.y[static_cast<std::size_t>(i)];
  }
  // The evaluation and predict run the same f32 forward of the same rows on the CPU.
  CHECK(hits == static_cast<int>(std::lround(summary.final_eval.accuracy * 60)));
}

// The ONNX export of dir/model.sgck (`fold`: with --fold-batch-norm, as
// folded.onnx) where this build has ONNX: the checker passes, input "input"
// [N, 36], outputs logits and probabilities, and the graph holds `ops`;
// returns its nodes' op types. Without ONNX: the one-line refusal, and no file.
std::vector<std::string> check_onnx_export(const fs::path& dir, const std::vector<std::string>& ops, bool fold = false) {
  const fs::path file = dir / (fold ? "folded.onnx" : "model.onnx");
  const app::ExportRequest e{(dir / "model.sgck").string(), "onnx", file.string(), fold};
  if (!exporting::onnx_export_available()) {
    CHECK(test::error_of([&] { app::run_export(e); }).find("no ONNX support") != std::string::npos);
    CHECK_FALSE(fs::exists(file));
    return {};
  }
  REQUIRE(app::run_export(e) == 0);
  std::vector<std::string> have;
#ifdef STEPGRAPH_HAVE_ONNX
  onnx::ModelProto model;
  REQUIRE(model.ParseFromString(io::read_file(file)));
  CHECK_NOTHROW(onnx::checker::check_model(model));
  CHECK(model.graph().input(0).name() == "input");
  CHECK(model.graph().input(0).type().tensor_type().shape().dim(1).dim_value() == 36);
  REQUIRE(model.graph().output_size() == 2);
  CHECK(model.graph().output(0).name() == "logits");
  CHECK(model.graph().output(1).name() == "probabilities");
  for (const auto& n : model.graph().node()) have.push_back(n.op_type());
  for (const auto& op : ops) {
    CAPTURE(op);
    CHECK(std::find(have.begin(), have.end(), op) != have.end());
  }
#endif
  return have;
}

}  // namespace

TEST_CASE("predict takes a model.sequential checkpoint (a residual CNN): the run's accuracy on the same rows") {
  const auto dir = test::fresh_dir("predict-sequential");
  const auto summary = train_on(
      make_patches, dir,
      "    - conv2d: {out: 4, kernel: 3, padding: 1}\n"
      "    - relu\n"
      "    - residual: {layers: [{conv2d: {out: 4, kernel: 3, padding: 1}}, relu, {conv2d: {out: 4, kernel: 3, padding: 1}}]}\n"
      "    - relu\n"
      "    - max_pool2d: {kernel: 2}\n"
      "    - flatten\n"
      "    - linear: {out: 3}\n",
      6);
  CHECK(summary.final_eval.accuracy > 0.9);

  const auto saved = app::load_saved_model(dir / "model.sgck");
  REQUIRE(saved.sequential);
  CHECK(saved.inputs() == 36);
  CHECK(saved.outputs() == 3);
  CHECK(saved.feature_dtype() == DType::f32);
  CHECK(saved.params.size() == 8);  // w and b of the stem conv, the block's two convs and the linear layer
  check_predict_follows_evaluation(make_patches, dir, summary);

  check_onnx_export(dir, {"Reshape", "Conv", "Relu", "Add", "MaxPool", "Flatten", "Gemm", "Softmax"});
  check_safetensors_export(dir, saved);
  fs::remove_all(dir);
}

TEST_CASE("predict and export of a CNN with avg_pool2d and global average pooling") {
  const auto dir = test::fresh_dir("predict-pooled");
  const auto summary = train_on(make_bars, dir,
                                "    - conv2d: {out: 8, kernel: 3, padding: 1}\n"
                                "    - relu\n"
                                "    - avg_pool2d: {kernel: 2}\n"
                                "    - conv2d: {out: 8, kernel: 3, padding: 1}\n"
                                "    - relu\n"
                                "    - global_avg_pool2d\n"
                                "    - linear: {out: 3}\n",
                                60);  // slow to start (a mean of 8 features feeds the classifier): 93% here
  CHECK(summary.final_eval.accuracy > 0.8);
  check_predict_follows_evaluation(make_bars, dir, summary);
  check_onnx_export(dir, {"Conv", "AveragePool", "GlobalAveragePool", "Flatten", "Gemm"});
  const std::string st = export_safetensors(dir, "model.safetensors").bytes;
  for (const char* line : {"h2 = F.avg_pool2d(h1, kernel_size=2, stride=2)",
                           "h5 = torch.flatten(F.adaptive_avg_pool2d(h4, 1), 1)", "self.layer6 = nn.Linear(8, 3)"})
    CHECK(st.find(line) != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("predict and export of a CNN with batch_norm: the running statistics as nn.BatchNorm's buffers") {
  const auto dir = test::fresh_dir("predict-batch-norm");
  const auto summary = train_on(make_patches, dir,
                                "    - conv2d: {out: 4, kernel: 3, padding: 1, bias: false}\n"
                                "    - batch_norm\n"
                                "    - relu\n"
                                "    - max_pool2d: {kernel: 2}\n"
                                "    - flatten\n"
                                "    - batch_norm: {eps: 0.001, momentum: 0.2}\n"
                                "    - linear: {out: 3}\n",
                                6);
  CHECK(summary.final_eval.accuracy > 0.9);
  const auto saved = app::load_saved_model(dir / "model.sgck");
  CHECK(saved.params.size() == 11);  // conv w (no bias); batch_norm w, b, running_mean, running_var (twice); linear w, b
  CHECK(saved.steps == 6 * 240 / 16);
  // Predict normalises by the running statistics, as the run's evaluation did.
  check_predict_follows_evaluation(make_patches, dir, summary);
  check_onnx_export(dir, {"Conv", "BatchNormalization", "MaxPool", "Flatten", "Gemm"});
  const SafetensorsFile st = export_safetensors(dir, "model.safetensors");
  const auto& header = st.header;
  const std::string code = st.module_code();
  INFO(code);
  for (const char* line : {"self.layer0 = nn.Conv2d(1, 4, kernel_size=3, stride=1, padding=1, bias=False)",
                           "self.layer1 = nn.BatchNorm2d(4, eps=1e-05, momentum=0.1)", "h1 = self.layer1(h0)",
                           "self.layer5 = nn.BatchNorm1d(36, eps=0.001, momentum=0.2)"})
    CHECK(code.find(line) != std::string::npos);
  CHECK_FALSE(header.contains("layer0.bias"));
  CHECK(header["layer5.running_var"]["shape"] == nlohmann::json(std::vector<std::int64_t>{36}));
  CHECK(st.floats("layer1.running_mean") == floats_from_blob(saved.params[3]));
  CHECK(st.floats("layer5.running_var") == floats_from_blob(saved.params[8]));
  CHECK(header["layer5.num_batches_tracked"]["dtype"] == "I64");
  CHECK(header["layer5.num_batches_tracked"]["shape"] == nlohmann::json::array());
  std::int64_t tracked = 0;
  const std::string bytes = st.data("layer5.num_batches_tracked");
  REQUIRE(bytes.size() == sizeof tracked);
  std::memcpy(&tracked, bytes.data(), sizeof tracked);
  CHECK(tracked == saved.steps);

  // Folded: the batch_norm after the conv joins it (the conv gains a bias); the one after flatten stays.
  const SafetensorsFile folded = export_safetensors(dir, "folded.safetensors", /*fold=*/true);
  const std::string& folded_st = folded.bytes;
  CHECK(folded_st.find("nn.BatchNorm2d") == std::string::npos);
  CHECK(folded_st.find("self.layer0 = nn.Conv2d(1, 4, kernel_size=3, stride=1, padding=1)") != std::string::npos);
  CHECK(folded.header.contains("layer0.bias"));
  CHECK(folded_st.find("h1 = h0") != std::string::npos);
  CHECK(folded_st.find("self.layer5 = nn.BatchNorm1d(36, eps=0.001, momentum=0.2)") != std::string::npos);
  CHECK(folded_st.find("layer1.running_mean") == std::string::npos);
  const auto ops = check_onnx_export(dir, {"Conv", "BatchNormalization", "MaxPool", "Flatten", "Gemm"}, /*fold=*/true);
  if (exporting::onnx_export_available()) CHECK(std::count(ops.begin(), ops.end(), "BatchNormalization") == 1);
  fs::remove_all(dir);
}
