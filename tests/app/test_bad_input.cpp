// Bad input and interruptions (issue 24): every case here failed before the
// fix. docs/bad_input.md lists what each kind of bad input gets.
#include <doctest/doctest.h>

#include <zlib.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <functional>
#include <random>
#include <regex>
#include <sstream>
#include <thread>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "apps/config/train_config.hpp"
#include "apps/inspect_command.hpp"
#include "apps/report/metrics_log.hpp"
#include "apps/training_run.hpp"
#include "runtime/data/idx_reader.hpp"
#include "runtime/io/atomic_file.hpp"
#include "runtime/io/checkpoint.hpp"
#include "tests/support/temp_files.hpp"
#include "tests/support/log_capture.hpp"
#include "tests/support/test_data.hpp"

using namespace sg;
namespace fs = std::filesystem;

using sg::test::logged;

namespace {

using test::fresh_dir;
using test::gunzip;
void write(const fs::path& p, const std::string& bytes) { test::write_file(p, bytes); }

std::string be32(std::uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

// A data folder: the real train split (links) and an edited raw copy of t10k.
fs::path data_with_t10k(const std::string& name, const std::function<void(std::string&, std::string&)>& edit) {
  const auto dir = fresh_dir(name);
  for (const char* f : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"})
    fs::create_symlink(sg::test::mnist_dir_or_skip() / f, dir / f);
  std::string images = gunzip(sg::test::mnist_dir_or_skip() / "t10k-images-idx3-ubyte.gz");
  std::string labels = gunzip(sg::test::mnist_dir_or_skip() / "t10k-labels-idx1-ubyte.gz");
  edit(images, labels);
  write(dir / "t10k-images-idx3-ubyte", images);
  write(dir / "t10k-labels-idx1-ubyte", labels);
  return dir;
}

app::TrainConfig ci_config(const fs::path& out, std::vector<std::string> extra = {},
                           const fs::path& data = sg::test::mnist_dir_or_skip()) {
  extra.insert(extra.begin(), "run.out_dir=" + out.string());
  extra.insert(extra.begin(), "data.dir=" + data.string());
  return app::load_config(sg::test::source_dir() / "configs/ci_small.yaml", extra);
}

std::size_t temp_files_in(const fs::path& dir) {
  std::size_t n = 0;
  if (fs::exists(dir))
    for (const auto& e : fs::directory_iterator(dir)) n += e.path().filename().string().find(".tmp") != std::string::npos;
  return n;
}

}  // namespace

TEST_CASE("1: a test label beyond the model's classes is an error before training") {
  const auto data = data_with_t10k("label", [](std::string&, std::string& labels) { labels[8 + 17] = static_cast<char>(200); });
  const auto out = fresh_dir("label-out");
  CHECK_THROWS_WITH_AS(app::run_training(ci_config(out, {}, data)), doctest::Contains("test labels in"), app::ConfigError);
  CHECK_FALSE(fs::exists(out / "metrics.csv"));
  fs::remove_all(data);
  fs::remove_all(out);
}

TEST_CASE("2: an IDX header claiming far more items than the file holds is a clear error naming the file") {
  const auto dir = fresh_dir("huge");
  std::string images = be32(0x803) + be32(0x7fffffff) + be32(28) + be32(28) + std::string(784 * 3, '\1');
  std::string labels = be32(0x801) + be32(0x7fffffff) + std::string(3, '\1');
  SUBCASE("raw") {
    write(dir / "t10k-images-idx3-ubyte", images);
    write(dir / "t10k-labels-idx1-ubyte", labels);
    CHECK_THROWS_WITH_AS(data::read_idx_images(dir / "t10k-images-idx3-ubyte"),
                         doctest::Contains("t10k-images-idx3-ubyte: truncated pixel data"), data::IdxError);
    CHECK_THROWS_WITH_AS(data::read_idx_labels(dir / "t10k-labels-idx1-ubyte"),
                         doctest::Contains("t10k-labels-idx1-ubyte: truncated label data"), data::IdxError);
  }
  SUBCASE("gzip") {  // no size to check up front: read in chunks, fail at the end of the data
    for (auto [name, bytes] : {std::pair{"t10k-images-idx3-ubyte.gz", images}, {"t10k-labels-idx1-ubyte.gz", labels}}) {
      gzFile f = gzopen((dir / name).c_str(), "wb");
      gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
      gzclose(f);
    }
    CHECK_THROWS_WITH_AS(data::read_idx_images(dir / "t10k-images-idx3-ubyte.gz"),
                         doctest::Contains("t10k-images-idx3-ubyte.gz: truncated pixel data"), data::IdxError);
    CHECK_THROWS_WITH_AS(data::read_idx_labels(dir / "t10k-labels-idx1-ubyte.gz"),
                         doctest::Contains("t10k-labels-idx1-ubyte.gz: truncated label data"), data::IdxError);
  }
  SUBCASE("dimensions whose product overflows") {
    write(dir / "x", be32(0x803) + be32(0xffffffff) + be32(0xffffffff) + be32(0xffffffff));
    CHECK_THROWS_WITH_AS(data::read_idx_images(dir / "x"), doctest::Contains("implausible image set header"), data::IdxError);
  }
  fs::remove_all(dir);
}

TEST_CASE("3: test images of another shape than the training images are an error") {
  // 10000 images of 14x56 (same byte count as 28x28).
  const auto data = data_with_t10k("shape", [](std::string& images, std::string&) {
    images.replace(8, 8, be32(14) + be32(56));
  });
  const auto out = fresh_dir("shape-out");
  CHECK_THROWS_WITH_AS(app::run_training(ci_config(out, {}, data)), doctest::Contains("test images in"), app::ConfigError);
  fs::remove_all(data);
  fs::remove_all(out);
}

TEST_CASE("4: bad output paths fail before any work and leave no temp files") {
  const auto dir = fresh_dir("paths");
  write(dir / "file", "a regular file");
  SUBCASE("checkpoint under a regular file") {
    CHECK_THROWS_AS(app::run_training(ci_config(dir / "out", {"run.checkpoint=" + (dir / "file" / "ck.sgck").string()})),
                    io::IoError);
    CHECK_FALSE(fs::exists(dir / "out" / "config.yaml"));  // nothing was done
  }
  SUBCASE("checkpoint path is a folder") {
    fs::create_directories(dir / "ckdir");
    CHECK_THROWS_WITH_AS(app::run_training(ci_config(dir / "out", {"run.checkpoint=" + (dir / "ckdir").string()})),
                         doctest::Contains("is a folder"), io::IoError);
    CHECK_FALSE(fs::exists(dir / "out" / "config.yaml"));
    CHECK(temp_files_in(dir) == 0);
  }
  SUBCASE("out_dir under a regular file") {
    CHECK_THROWS_WITH_AS(app::run_training(ci_config(dir / "file" / "out")), doctest::Contains("run.out_dir"), io::IoError);
  }
  SUBCASE("inspect -o an existing folder") {
    fs::create_directories(dir / "dumpdir");
    app::InspectRequest request;
    request.format = "text";
    request.out = (dir / "dumpdir").string();
    CHECK_THROWS_WITH_AS(app::run_inspect(ci_config(dir / "out"), request), doctest::Contains("is a folder"), io::IoError);
    CHECK(temp_files_in(dir) == 0);
  }
  SUBCASE("an atomic write that cannot replace its target removes its temp file") {
    fs::create_directories(dir / "target" / "inside");
    CHECK_THROWS_AS(io::write_file_atomically(dir / "target", "bytes"), io::IoError);
    CHECK(temp_files_in(dir) == 0);
  }
  fs::remove_all(dir);
}

TEST_CASE("5: a stop request takes effect within one launch, not at the next log step") {
  const auto out = fresh_dir("stop");
  std::atomic<bool> stop{false};
  std::thread stopper([&] {
    while (!fs::exists(out / "config.yaml")) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    stop = true;
  });
  const auto start = std::chrono::steady_clock::now();
  const auto summary =
      app::run_training(ci_config(out, {"run.steps=200000", "run.log_every=200000", "run.eval_every=0"}), {&stop, false});
  stopper.join();
  CHECK(summary.interrupted);
  CHECK(summary.steps < 200000);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
  CHECK(io::load_checkpoint(out / "checkpoint.sgck").step == summary.steps);
  fs::remove_all(out);
}

TEST_CASE("6: summaries and resume") {
  const auto out = fresh_dir("resume");
  SUBCASE("an interrupted run's summary does not print a zero test accuracy") {
    std::atomic<bool> stop{true};
    const auto text = logged([&] { app::run_training(ci_config(out), {&stop, false}); });
    CHECK(text.find("test accuracy 0.00%") == std::string::npos);
    CHECK(text.find("not evaluated") != std::string::npos);
  }
  SUBCASE("resuming a finished run reports no throughput") {
    app::run_training(ci_config(out / "a", {"run.checkpoint=" + (out / "a.sgck").string()}));
    const auto again = app::run_training(ci_config(out / "b", {"run.resume=" + (out / "a.sgck").string()}));
    CHECK(again.steps == 300);
    CHECK(again.samples_per_second == 0);
  }
  SUBCASE("resuming into the same out_dir appends to metrics.csv and keeps the elapsed time") {
    app::run_training(ci_config(out, {"run.steps=100", "run.checkpoint=" + (out / "a.sgck").string()}));
    const auto first = report::MetricsLog::read_csv(out / "metrics.csv");
    REQUIRE(!first.empty());
    app::run_training(ci_config(out, {"run.steps=200", "run.resume=" + (out / "a.sgck").string()}));
    const auto rows = report::MetricsLog::read_csv(out / "metrics.csv");
    std::vector<std::int64_t> steps;
    for (const auto& r : rows)
      if (std::isfinite(r.train_loss)) steps.push_back(r.step);
    CHECK(steps == std::vector<std::int64_t>{50, 100, 150, 200});
    CHECK(rows.back().elapsed_s >= first.back().elapsed_s);
  }
  SUBCASE("a resume whose config changes the trajectory is refused, naming the key") {
    app::run_training(ci_config(out, {"run.steps=50", "run.checkpoint=" + (out / "a.sgck").string()}));
    const auto resume = "run.resume=" + (out / "a.sgck").string();
    CHECK_THROWS_WITH_AS(app::run_training(ci_config(out / "m", {resume, "optim.momentum=0.9"})),
                         doctest::Contains("optim.momentum"), app::ConfigError);
    CHECK_THROWS_WITH_AS(app::run_training(ci_config(out / "t", {resume, "data.train_limit=1000"})),
                         doctest::Contains("data.train_limit"), app::ConfigError);
    CHECK_THROWS_WITH_AS(app::run_training(ci_config(out / "b", {resume, "data.batch_size=16"})),
                         doctest::Contains("data.batch_size"), app::ConfigError);
    CHECK_THROWS_WITH_AS(app::run_training(ci_config(out / "l", {resume, "model.layers=[784, 32, 10]"})),
                         doctest::Contains("model.layers"), app::ConfigError);
    CHECK_NOTHROW(app::run_training(ci_config(out / "ok", {resume, "run.steps=100", "run.log_every=25"})));
  }
  fs::remove_all(out);
}

TEST_CASE("7: config messages") {
  const std::string minimal = "model:\n  layers: [784, 64, 10]\nrun:\n  steps: 10\n";
  auto error_of = [&](const std::string& yaml, const std::vector<std::string>& overrides = {}) -> std::string {
    try {
      app::parse_config(yaml, "test.yaml", overrides);
    } catch (const app::ConfigError& e) {
      return e.what();
    }
    return "";
  };
  // --set value errors name the override, not line 1 of the file.
  const auto set_error = error_of(minimal, {"data.batch_size=-3"});
  CHECK(set_error.find("--set 'data.batch_size=-3'") != std::string::npos);
  CHECK(set_error.find("test.yaml:1") == std::string::npos);
  CHECK(error_of("- model\n- data\n").find("top level must be a mapping") != std::string::npos);
  CHECK(error_of(minimal + "optim:\n  lr: 0.1\n  lr: 0.2\n").find("test.yaml:7: optim.lr: duplicate key") != std::string::npos);
  CHECK(error_of(minimal + "model:\n  activation: relu\n").find("duplicate key") != std::string::npos);
  // Found by the fuzz test: complex keys threw YAML::TypedBadConversion, not ConfigError.
  CHECK(error_of("model:\n ?  layers: [784, 128, 10]\nrun:\n  steps: 3\n").find("keys must be plain names") != std::string::npos);
  CHECK(error_of("? [a, b]\n: 1\n").find("keys must be plain names") != std::string::npos);
  CHECK(error_of(minimal + "optim:\n  lr: .inf\n").find("optim.lr: must be a finite number") != std::string::npos);
  CHECK(error_of(minimal, {"data.std=.nan"}).find("finite") != std::string::npos);
  // Floats print as the shortest text that reads back exactly.
  const auto c = app::parse_config(minimal + "optim:\n  lr: 0.05\n  momentum: 0.9\n", "t.yaml");
  const auto yaml = app::to_yaml(c);
  CHECK(yaml.find("lr: 0.05\n") != std::string::npos);
  CHECK(yaml.find("momentum: 0.9\n") != std::string::npos);
  CHECK(yaml.find("0.050000000000000003") == std::string::npos);
  const auto back = app::parse_config(yaml, "back.yaml");
  CHECK(back.optim.lr == c.optim.lr);
  CHECK(back.data.mean == c.data.mean);
}

TEST_CASE("8: a NaN loss is caught at the step it first appears, not only at the next log step") {
  const auto out = fresh_dir("nan");
  auto message = [&](const std::string& log_every) -> std::string {
    try {
      app::run_training(ci_config(out, {"optim.lr=1e30", "run.log_every=" + log_every}));
    } catch (const app::TrainingError& e) {
      return e.what();
    }
    return "";
  };
  const std::regex first_re("first non-finite loss was at step ([0-9]+)");
  std::smatch every_step, at_50;
  const auto m1 = message("1");
  const auto m50 = message("50");
  REQUIRE(std::regex_search(m1, every_step, first_re));
  REQUIRE(std::regex_search(m50, at_50, first_re));
  CHECK(every_step[1].str() == at_50[1].str());  // the same first bad step whatever log_every is
  CHECK(std::stoi(at_50[1].str()) < 50);
  CHECK(m50.find("at step 50") != std::string::npos);  // detected at the log step
  fs::remove_all(out);
}
