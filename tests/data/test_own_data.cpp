// Own data (issue 23): the .npy/.npz/CSV readers on files the tests write
// byte by byte, their one-line errors on corrupt or mismatched files, each
// format trained end to end on the CPU backend, and predict / export of the
// trained model.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "apps/config/train_config.hpp"
#include "apps/export_command.hpp"
#include "apps/predict_command.hpp"
#include "apps/saved_model.hpp"
#include "apps/training_run.hpp"
#include "runtime/data/csv_table.hpp"
#include "runtime/data/dataset_files.hpp"
#include "runtime/data/npy_array.hpp"
#include "runtime/data/npz_archive.hpp"
#include "runtime/export/onnx_writer.hpp"
#include "runtime/export/safetensors_writer.hpp"
#include "runtime/io/atomic_file.hpp"
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

// Three Gaussian blobs in `d` dimensions: learnable to > 90% by a small MLP.
struct Blobs {
  std::int64_t n = 0, d = 0;
  std::vector<float> x;
  std::vector<std::int64_t> y;
};

Blobs make_blobs(std::int64_t n, std::int64_t d, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> noise(0.f, 0.5f);
  Blobs b{n, d, {}, {}};
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t c = i % 3;
    b.y.push_back(c);
    for (std::int64_t j = 0; j < d; ++j) b.x.push_back((j % 3 == c ? 2.f : 0.f) + noise(rng));
  }
  return b;
}

std::string expect_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  FAIL("no error thrown");
  return {};
}

app::TrainConfig own_config(const fs::path& dir, std::vector<std::string> sets) {
  sets.push_back("run.out_dir=" + (dir / "run").string());
  const std::string yaml =
      "model: {layers: [6, 16, 3]}\n"
      "data: {batch_size: 16, eval_batch_size: 30}\n"
      "optim: {lr: 0.1}\n"
      "run: {epochs: 8, log_every: 1000}\n"
      "backend: {kind: cpu}\n";
  return app::parse_config(yaml, "own_data test", sets);
}

}  // namespace

TEST_CASE("npy: u8, f16, f32, f64 and int labels parse, the writer's output reads back") {
  const auto a = data::parse_npy(test::npy_f32({2, 3}, {1, 2, 3, 4, 5, 6}), "a.npy");
  CHECK(a.kind == 'f');
  CHECK(a.item_size == 4);
  CHECK(a.shape == std::vector<std::int64_t>{2, 3});
  CHECK(data::npy_element(a, 5) == 6.0);
  const auto h = data::parse_npy(test::npy_f16({3}, {0.5f, -2.f, 1024.f}), "h.npy");
  CHECK(data::npy_element(h, 1) == -2.0);
  CHECK(data::npy_element(data::parse_npy(test::npy_i64({2}, {7, -1}), "i.npy"), 1) == -1.0);
  CHECK(data::npy_element(data::parse_npy(test::npy_u8({2}, {0, 255}), "u.npy"), 1) == 255.0);
  const auto back = data::parse_npy(data::npy_bytes_f32({2, 2}, {1.5f, 2.5f, 3.5f, 4.5f}), "w.npy");
  CHECK(back.shape == std::vector<std::int64_t>{2, 2});
  CHECK(data::npy_element(back, 3) == 4.5);
}

TEST_CASE("npy: corrupt or unsupported files are one clear error naming the file") {
  const std::string good = test::npy_f32({2, 3}, {1, 2, 3, 4, 5, 6});
  CHECK(expect_error([&] { data::parse_npy("hello", "x.npy"); }).find("x.npy: not a .npy file") == 0);
  CHECK(expect_error([&] { data::parse_npy(good.substr(0, good.size() - 4), "x.npy"); }).find("x.npy: truncated") == 0);
  CHECK(expect_error([&] { data::parse_npy(good + "junk", "x.npy"); }).find("unexpected bytes") != std::string::npos);
  CHECK(expect_error([&] { data::parse_npy(test::npy_bytes("<c8", {1}, std::string(8, '\0')), "x.npy"); })
            .find("unsupported dtype '<c8'") != std::string::npos);
  CHECK(expect_error([&] { data::parse_npy(test::npy_bytes(">f4", {1}, std::string(4, '\0')), "x.npy"); })
            .find("big-endian") != std::string::npos);
  std::string fortran = good;
  fortran.replace(fortran.find("False"), 5, "True ");
  CHECK(expect_error([&] { data::parse_npy(fortran, "x.npy"); }).find("Fortran") != std::string::npos);
  std::string huge = test::npy_bytes("<f4", {1}, std::string(4, '\0'));
  huge.replace(huge.find("(1,)"), 4, "(99999999999999,)");
  CHECK(expect_error([&] { data::parse_npy(huge, "x.npy"); }).find("x.npy: ") == 0);
}

TEST_CASE("npz: stored and deflated members read back, a bad CRC, a cut file and a missing array are clear errors") {
  const auto dir = test::fresh_dir("npz");
  const std::string x = test::npy_f32({2, 2}, {1, 2, 3, 4});
  const std::string y = test::npy_i64({2}, {0, 1});
  for (bool deflate : {false, true}) {
    test::write_file(dir / "a.npz", test::zip_bytes({{"x_train.npy", x}, {"y_train.npy", y}}, deflate));
    const data::NpzArchive archive(dir / "a.npz");
    CHECK(archive.names() == std::vector<std::string>{"x_train", "y_train"});
    CHECK(data::npy_element(archive.array("x_train"), 3) == 4.0);
    CHECK(data::npy_element(archive.array("y_train"), 1) == 1.0);
    CHECK(expect_error([&] { (void)archive.array("x_test"); }).find("no array 'x_test' (it holds: x_train, y_train)") !=
          std::string::npos);
  }
  std::string zip = test::zip_bytes({{"x.npy", x}}, false);
  zip[zip.find("NUMPY") + 40] ^= 1;  // payload changed, CRC not
  test::write_file(dir / "crc.npz", zip);
  CHECK(expect_error([&] { (void)data::NpzArchive(dir / "crc.npz").array("x"); }).find("CRC-32 mismatch") !=
        std::string::npos);
  const std::string deflated = test::zip_bytes({{"x.npy", x}}, true);
  test::write_file(dir / "cut.npz", deflated.substr(0, deflated.size() / 2));
  CHECK(expect_error([&] { data::NpzArchive a(dir / "cut.npz"); (void)a.array("x"); }).find("cut.npz") !=
        std::string::npos);
  test::write_file(dir / "text.npz", "not a zip at all, just some text that is long enough");
  CHECK(expect_error([&] { data::NpzArchive a(dir / "text.npz"); }).find("text.npz: corrupt .npz: no zip end") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("csv: header and numbers, a missing column, a word and a short row are clear errors") {
  const auto t = data::parse_csv("a, b ,\"label\"\n1,2.5,0\n-3e1, 4 ,1\n\n", "t.csv");
  CHECK(t.columns == std::vector<std::string>{"a", "b", "label"});
  CHECK(t.rows() == 2);
  CHECK(t.values[3] == -30.0);
  CHECK(t.column("label") == 2);
  CHECK(expect_error([] { data::parse_csv("a,b\n1,x\n", "t.csv"); }) == "t.csv:2: column 'b': 'x' is not a number");
  CHECK(expect_error([] { data::parse_csv("a,b\n1\n", "t.csv"); }) == "t.csv:2: 1 fields, but the header has 2 columns");
  CHECK(expect_error([] { data::parse_csv("", "t.csv"); }).find("empty CSV") != std::string::npos);
  CHECK(expect_error([] { data::parse_csv("a,a\n1,2\n", "t.csv"); }).find("appears twice") != std::string::npos);
}

TEST_CASE("each format trains end to end on the CPU backend, predict and export agree with the trained model") {
  const auto dir = test::fresh_dir("own-data");
  const Blobs train = make_blobs(300, 6, 1), test_set = make_blobs(90, 6, 2);
  test::write_file(dir / "x.npy", test::npy_f32({train.n, train.d}, train.x));
  test::write_file(dir / "y.npy", test::npy_i64({train.n}, train.y));
  test::write_file(dir / "xt.npy", test::npy_f32({test_set.n, test_set.d}, test_set.x));
  test::write_file(dir / "yt.npy", test::npy_i64({test_set.n}, test_set.y));
  test::write_file(dir / "all.npz", test::zip_bytes({{"x_train.npy", test::npy_f16({train.n, 2, 3}, train.x)},
                                                     {"y_train.npy", test::npy_i64({train.n}, train.y)},
                                                     {"x_test.npy", test::npy_f16({test_set.n, 2, 3}, test_set.x)},
                                                     {"y_test.npy", test::npy_i64({test_set.n}, test_set.y)}},
                                                    true));
  std::ostringstream csv;
  csv << "f0,f1,f2,class,f3,f4,f5\n";
  for (std::int64_t i = 0; i < train.n; ++i) {
    for (std::int64_t j = 0; j < 6; ++j) {
      if (j == 3) csv << train.y[i] << ",";
      csv << train.x[i * 6 + j] << (j == 5 ? "\n" : ",");
    }
  }
  test::write_file(dir / "t.csv", csv.str());

  const std::vector<std::pair<std::string, std::vector<std::string>>> runs = {
      {"npy files, test files", {"data.train_x=" + (dir / "x.npy").string(), "data.train_y=" + (dir / "y.npy").string(),
                                 "data.test_x=" + (dir / "xt.npy").string(), "data.test_y=" + (dir / "yt.npy").string()}},
      {"npz (f16, N x 2 x 3), its x_test", {"data.train_x=" + (dir / "all.npz").string()}},
      {"csv, test_fraction", {"data.train_x=" + (dir / "t.csv").string(), "data.label_column=class",
                              "data.test_fraction=0.2", "data.split_seed=3", "data.normalize=true", "data.mean=0.5",
                              "data.std=1.5"}},
  };
  for (const auto& [what, sets] : runs) {
    INFO(what);
    auto s = sets;
    s.push_back("run.checkpoint=" + (dir / "model.sgck").string());
    const auto summary = app::run_training(own_config(dir, s));
    CHECK(summary.final_eval.accuracy > 0.9);
    CHECK(summary.final_eval.examples == (what.rfind("csv", 0) == 0 ? 60 : 90));
  }

  // The last model (csv, normalised f32 features): predict on the CPU backend gives the eval's accuracy.
  const Blobs rows = make_blobs(50, 6, 9);
  test::write_file(dir / "rows.npy", test::npy_f32({rows.n, rows.d}, rows.x));
  app::PredictRequest p;
  p.checkpoint = (dir / "model.sgck").string();
  p.input = (dir / "rows.npy").string();
  p.out = (dir / "preds.npy").string();
  p.backend = "cpu";
  p.batch_size = 16;  // 50 rows: the last batch is padded
  CHECK(app::run_predict(p) == 0);
  const auto preds = data::read_npy(dir / "preds.npy");
  REQUIRE(preds.shape == std::vector<std::int64_t>{50, 3});
  int hits = 0;
  for (std::int64_t i = 0; i < rows.n; ++i) {
    double sum = 0, best = -1;
    std::int64_t arg = -1;
    for (std::int64_t c = 0; c < 3; ++c) {
      const double v = data::npy_element(preds, i * 3 + c);
      sum += v;
      if (v > best) best = v, arg = c;
    }
    CHECK(sum == doctest::Approx(1.0).epsilon(1e-5));
    hits += arg == rows.y[i];
  }
  CHECK(hits >= 45);
  // The predictions are the model's: a tiny host forward pass (the test oracle) over the saved f32 weights.
  const auto saved = app::load_saved_model(dir / "model.sgck");
  CHECK(saved.mlp.feature_dtype == DType::f32);
  for (std::int64_t i = 0; i < 5; ++i) {
    std::vector<double> h(rows.x.begin() + i * 6, rows.x.begin() + (i + 1) * 6);
    for (auto& v : h) v = v * saved.mlp.input_scale + saved.mlp.input_shift;
    for (std::size_t l = 0; l < saved.layers.size(); ++l) {
      const auto& L = saved.layers[l];
      std::vector<double> o(L.out);
      for (std::int64_t r = 0; r < L.out; ++r) {
        o[r] = L.bias[r];
        for (std::int64_t c = 0; c < L.in; ++c) o[r] += L.weight[r * L.in + c] * h[c];
        if (l + 1 < saved.layers.size()) o[r] = std::max(0.0, o[r]);
      }
      h = o;
    }
    const double top = *std::max_element(h.begin(), h.end());
    double z = 0;
    for (auto v : h) z += std::exp(v - top);
    for (std::int64_t c = 0; c < 3; ++c)
      CHECK(data::npy_element(preds, i * 3 + c) == doctest::Approx(std::exp(h[c] - top) / z).epsilon(1e-3));
  }

  // safetensors: the header parses back with PyTorch's names, shapes and the checkpoint's f32 weights.
  app::ExportRequest e{p.checkpoint, "safetensors", (dir / "model.safetensors").string()};
  CHECK(app::run_export(e) == 0);
  const test::SafetensorsFile file = test::read_safetensors(dir / "model.safetensors");
  const std::string& st = file.bytes;
  const std::uint64_t header_len = file.header_len;
  const auto& header = file.header;
  CHECK(header["__metadata__"]["stepgraph.torch_module"] == "nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))");
  CHECK(header["0.weight"]["shape"] == nlohmann::json::array({16, 6}));
  CHECK(header["2.bias"]["dtype"] == "F32");
  CHECK(header["2.weight"]["shape"] == nlohmann::json::array({3, 16}));
  const auto off = header["2.weight"]["data_offsets"];
  float w0 = 0;
  std::memcpy(&w0, st.data() + 8 + header_len + off[0].get<std::size_t>(), sizeof w0);
  CHECK(w0 == saved.layers[1].weight[0]);
  CHECK(8 + header_len + header["2.bias"]["data_offsets"][1].get<std::size_t>() == st.size());

  e.format = "onnx";
  e.out = (dir / "model.onnx").string();
  if (!exporting::onnx_export_available()) {
    CHECK(expect_error([&] { app::run_export(e); }).find("no ONNX support") != std::string::npos);
  } else {
    CHECK(app::run_export(e) == 0);
#ifdef STEPGRAPH_HAVE_ONNX
    onnx::ModelProto model;
    REQUIRE(model.ParseFromString(io::read_file(dir / "model.onnx")));
    CHECK_NOTHROW(onnx::checker::check_model(model));
    CHECK(model.graph().input(0).name() == "input");
    REQUIRE(model.graph().output_size() == 2);
    CHECK(model.graph().output(0).name() == "logits");
    CHECK(model.graph().output(1).name() == "probabilities");
    CHECK(model.opset_import(0).version() == exporting::kOnnxOpset);
#endif
  }
  fs::remove_all(dir);
}

TEST_CASE("mismatched data is one clear error before training") {
  const auto dir = test::fresh_dir("own-data-bad");
  const Blobs b = make_blobs(60, 6, 1);
  test::write_file(dir / "x.npy", test::npy_f32({b.n, b.d}, b.x));
  test::write_file(dir / "y.npy", test::npy_i64({b.n}, b.y));
  test::write_file(dir / "y_short.npy", test::npy_i64({b.n - 1}, std::vector<std::int64_t>(b.y.begin(), b.y.end() - 1)));
  std::vector<std::int64_t> big = b.y;
  big[7] = 5;
  test::write_file(dir / "y_big.npy", test::npy_i64({b.n}, big));
  std::vector<float> nan_x = b.x;
  nan_x[13] = NAN;
  test::write_file(dir / "x_nan.npy", test::npy_f32({b.n, b.d}, nan_x));
  test::write_file(dir / "x_int.npy", test::npy_i64({2, 6}, std::vector<std::int64_t>(12, 1)));
  test::write_file(dir / "x_5.npy", test::npy_f32({b.n, 5}, std::vector<float>(b.n * 5, 0.f)));
  test::write_file(dir / "t.csv", "a,b,c,d,e,f,label\n1,2,3,4,5,6,0\n");
  test::write_file(dir / "bad.csv", "a,b,c,d,e,f,label\n1,2,3,x,5,6,0\n");
  test::write_file(dir / "cut.npy", test::npy_f32({b.n, b.d}, b.x).substr(0, 200));
  auto run = [&](std::vector<std::string> sets) {
    return expect_error([&] { app::run_training(own_config(dir, sets)); });
  };
  const std::string x = "data.train_x=" + (dir / "x.npy").string();
  const std::string y = "data.train_y=" + (dir / "y.npy").string();
  const std::string frac = "data.test_fraction=0.25";
  CHECK(run({x, "data.train_y=" + (dir / "y_short.npy").string(), frac}).find("holds 60 examples but data.train_y") !=
        std::string::npos);
  CHECK(run({x, "data.train_y=" + (dir / "y_big.npy").string(), frac}).find("the model has 3 outputs but the labels") !=
        std::string::npos);
  CHECK(run({"data.train_x=" + (dir / "x_nan.npy").string(), y, frac}).find("data.train_x " + (dir / "x_nan.npy").string() + ": feature value nan at row 2, feature 1") == 0);
  CHECK(run({"data.train_x=" + (dir / "x_int.npy").string(), y, frac}).find("features are int64") != std::string::npos);
  CHECK(run({"data.train_x=" + (dir / "x_5.npy").string(), y, frac}).find("model.layers[0] is 6") != std::string::npos);
  CHECK(run({x, y}).find("data.test_x: missing") == 0);
  CHECK(run({x, y, "data.test_fraction=1.5"}).find("data.test_fraction: must be in (0, 1)") != std::string::npos);
  CHECK(run({x, y, "data.test_fraction=0.001"}).find("leaves 0 test") != std::string::npos);
  CHECK(run({x, frac}).find("data.train_y: missing") == 0);
  CHECK(run({"data.train_x=" + (dir / "t.csv").string(), "data.label_column=target", frac})
            .find("no column 'target' (data.label_column); the header has: a, b, c, d, e, f, label") != std::string::npos);
  CHECK(run({"data.train_x=" + (dir / "bad.csv").string(), "data.label_column=label", frac})
            .find("bad.csv:2: column 'd': 'x' is not a number") != std::string::npos);
  CHECK(run({"data.train_x=" + (dir / "cut.npy").string(), y, frac}).find("cut.npy: truncated") != std::string::npos);
  CHECK(run({"data.train_x=" + (dir / "x.bin").string()}).find("data.format: cannot guess") == 0);
  fs::remove_all(dir);
}

TEST_CASE("float targets (model.loss mse) train end to end on the CPU backend, predict writes the outputs") {
  const auto dir = test::fresh_dir("own-data-regression");
  std::mt19937_64 rng(4);
  std::normal_distribution<float> normal;
  const std::int64_t n = 400;
  std::vector<float> x(n * 6), y(n * 2);
  for (auto& v : x) v = normal(rng);
  double mean_sq = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    y[i * 2] = std::tanh(x[i * 6] - 0.5f * x[i * 6 + 1]);
    y[i * 2 + 1] = 0.5f * x[i * 6 + 2] * x[i * 6 + 3];
    mean_sq += (y[i * 2] * y[i * 2] + y[i * 2 + 1] * y[i * 2 + 1]) / (2.0 * n);
  }
  test::write_file(dir / "x.npy", test::npy_f32({n, 6}, x));
  test::write_file(dir / "y.npy", test::npy_f32({n, 2}, y));
  const auto summary = app::run_training(own_config(
      dir, {"model.layers=[6, 32, 2]", "model.loss=mse", "data.train_x=" + (dir / "x.npy").string(),
            "data.train_y=" + (dir / "y.npy").string(), "data.test_fraction=0.25", "run.epochs=30",
            "optim.lr=0.05", "run.checkpoint=" + (dir / "r.sgck").string()}));
  CHECK(std::isnan(summary.final_eval.accuracy));
  CHECK(summary.final_eval.loss < 0.5 * mean_sq);  // well below predicting zero
  app::PredictRequest p;
  p.checkpoint = (dir / "r.sgck").string();
  p.input = (dir / "x.npy").string();
  p.out = (dir / "p.npy").string();
  p.backend = "cpu";
  CHECK(app::run_predict(p) == 0);
  const auto preds = data::read_npy(dir / "p.npy");
  REQUIRE(preds.shape == std::vector<std::int64_t>{n, 2});
  double err = 0;
  for (std::int64_t i = 0; i < n * 2; ++i) err += std::pow(data::npy_element(preds, i) - y[i], 2) / (2.0 * n);
  CHECK(err < 0.5 * mean_sq);
  // A class-label model refuses the float targets, and a mismatched width is named.
  CHECK(expect_error([&] {
          app::run_training(own_config(dir, {"data.train_x=" + (dir / "x.npy").string(),
                                             "data.train_y=" + (dir / "y.npy").string(), "data.test_fraction=0.25"}));
        }).find("class labels must have shape N or N x 1, got (400, 2)") != std::string::npos);
  CHECK(expect_error([&] {
          app::run_training(own_config(dir, {"model.layers=[6, 32, 3]", "model.loss=mse",
                                             "data.train_x=" + (dir / "x.npy").string(),
                                             "data.train_y=" + (dir / "y.npy").string(), "data.test_fraction=0.25"}));
        }).find("the model predicts 3 value(s) per example") != std::string::npos);
  // predict checks its input against the model.
  test::write_file(dir / "x5.npy", test::npy_f32({3, 5}, std::vector<float>(15, 0.f)));
  p.input = (dir / "x5.npy").string();
  CHECK(expect_error([&] { app::run_predict(p); }).find("5 features per row, but the model in") != std::string::npos);
  test::write_file(dir / "xu8.npy", test::npy_u8({3, 6}, std::vector<std::uint8_t>(18, 1)));
  p.input = (dir / "xu8.npy").string();
  CHECK(expect_error([&] { app::run_predict(p); }).find("u8 features, but the model in") != std::string::npos);
  fs::remove_all(dir);
}
