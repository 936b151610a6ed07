// Issue 34's rough inputs: each case below got a misleading or raw message
// (or was silently accepted) before its fix; docs/bad_input.md lists what
// each input gets now. Tiny data made here; the CPU backend; no MNIST.
#include <doctest/doctest.h>

#include <unistd.h>

#include <CLI/CLI.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>

#include <fmt/format.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "apps/bench_command.hpp"
#include "apps/config/train_config.hpp"
#include "apps/export_command.hpp"
#include "apps/inspect_command.hpp"
#include "apps/load_dataset.hpp"
#include "apps/predict_command.hpp"
#include "apps/profile_command.hpp"
#include "apps/report/metrics_log.hpp"
#include "apps/report/profile_table.hpp"
#include "apps/report/svg_plot.hpp"
#include "apps/training_run.hpp"
#include "runtime/data/idx_reader.hpp"
#include "runtime/export/exported_mlp.hpp"
#include "runtime/io/atomic_file.hpp"
#include "tests/support/npy_files.hpp"
#include "tests/support/temp_files.hpp"
#include "tests/support/error_text.hpp"
#include "tests/support/log_capture.hpp"

using namespace sg;
namespace fs = std::filesystem;

using sg::test::error_of;
using sg::test::logged;

namespace {

// Six features, three classes, three CPU steps.
const std::string kBase =
    "model: {layers: [6, 8, 3]}\n"
    "data: {batch_size: 10, eval_batch_size: 10}\n"
    "run: {steps: 3, log_every: 100}\n"
    "backend: {kind: cpu}\n";

app::TrainConfig config_with(std::vector<std::string> sets, const std::string& yaml = kBase) {
  return app::parse_config(yaml, "rough.yaml", sets);
}

bool starts_with(const std::string& text, const std::string& prefix) { return text.rfind(prefix, 0) == 0; }

// 60 rows of six float32 features and their class labels 0..2.
void write_npy_pair(const fs::path& dir) {
  std::vector<float> x(60 * 6);
  std::vector<std::int64_t> y(60);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 7) % 11) / 11.f;
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<std::int64_t>(i % 3);
  test::write_file(dir / "x.npy", test::npy_f32({60, 6}, x));
  test::write_file(dir / "y.npy", test::npy_i64({60}, y));
}

// A CSV table of `rows` rows (features a..f, then label), with `label_text` as the last row's label.
std::string csv_text(int rows, const std::string& last_label) {
  std::string t = "a,b,c,d,e,f,label\n";
  for (int r = 0; r < rows; ++r)
    t += fmt::format("{},1,2,3,4,5,{}\n", r, r + 1 == rows ? last_label : std::to_string(r % 3));
  return t;
}

// The error of a CLI11 parse of `line` by a subcommand's options.
std::string cli_error(const std::function<void(CLI::App&)>& add_options, const std::string& line) {
  CLI::App app;
  add_options(app);
  try {
    app.parse(line);
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("1: -c a folder or an empty file says what is wrong with the file, not with model.layers") {
  const auto dir = test::fresh_dir("rough-config");
  CHECK(error_of([&] { app::load_config(dir); }) == dir.string() + ": is a folder, expected a YAML config file");
  test::write_file(dir / "empty.yaml", "");
  test::write_file(dir / "comments.yaml", "# nothing here yet\n\n");
  for (const char* name : {"empty.yaml", "comments.yaml"}) {
    INFO(name);
    const auto error = error_of([&] { app::load_config(dir / name, {"run.steps=5"}); });
    CHECK(starts_with(error, (dir / name).string() + ": the config file is empty"));
    CHECK(error.find("model.layers") == std::string::npos);
  }
  fs::remove_all(dir);
}

TEST_CASE("2: a data path that cannot be looked at is one line naming its key, not a filesystem_error") {
  const auto dir = test::fresh_dir("rough-paths");
  fs::create_directory_symlink(dir / "loop", dir / "loop");  // stat through it: ELOOP, even as root
  const std::string loop = (dir / "loop").string();
  SUBCASE("data.dir through a symlink loop") {
    const auto error = error_of([&] { app::load_dataset(config_with({"data.dir=" + loop})); });
    CHECK(error == "data.dir " + loop + ": cannot read: Too many levels of symbolic links");
  }
  SUBCASE("data.dir is a file") {
    test::write_file(dir / "x.npz", "PK");
    const auto error = error_of([&] { app::load_dataset(config_with({"data.dir=" + (dir / "x.npz").string()})); });
    CHECK(starts_with(error, "data.dir " + (dir / "x.npz").string() + ": is a file, expected the folder of the four IDX files"));
  }
  SUBCASE("data.dir without read permission (as a non-root user; root reads it anyway)") {
    fs::create_directories(dir / "locked");
    test::write_file(dir / "locked" / "train-images-idx3-ubyte.gz", "x");
    fs::permissions(dir / "locked", fs::perms::none);
    const auto error = error_of([&] { app::load_dataset(config_with({"data.dir=" + (dir / "locked").string()})); });
    if (::geteuid() != 0)
      CHECK(error == "data.dir " + (dir / "locked").string() + ": cannot read train-images-idx3-ubyte.gz: Permission denied");
    fs::permissions(dir / "locked", fs::perms::owner_all);
  }
  SUBCASE("the IDX reader itself (bench --data) names the folder") {
    CHECK_THROWS_WITH_AS(data::load_split(dir / "loop", "train"),
                         (loop + ": cannot read train-images-idx3-ubyte.gz: Too many levels of symbolic links").c_str(),
                         data::IdxError);
  }
  SUBCASE("data.train_x / data.train_y through a loop, or a folder") {
    write_npy_pair(dir);
    const std::string y = "data.train_y=" + (dir / "y.npy").string(), frac = "data.test_fraction=0.25";
    CHECK(error_of([&] { app::load_dataset(config_with({"data.train_x=" + loop + "/x.npy", y, frac})); }) ==
          "data.train_x " + loop + "/x.npy: cannot read: Too many levels of symbolic links");
    fs::create_directories(dir / "folder.npy");
    CHECK(error_of([&] { app::load_dataset(config_with({"data.train_x=" + (dir / "folder.npy").string(), y, frac})); }) ==
          "data.train_x " + (dir / "folder.npy").string() + ": is a folder, expected a file");
    CHECK(error_of([&] {
            app::load_dataset(config_with({"data.train_x=" + (dir / "x.npy").string(), "data.train_y=" + loop + "/y.npy", frac}));
          }) == "data.train_y " + loop + "/y.npy: cannot read: Too many levels of symbolic links");
  }
  fs::remove_all(dir);
}

TEST_CASE("3: a file whose content is not what data.format reads is named with the format, not a later symptom") {
  const auto dir = test::fresh_dir("rough-format");
  write_npy_pair(dir);
  test::write_file(dir / "t.csv", csv_text(9, "1"));
  const std::string csv = (dir / "t.csv").string(), frac = "data.test_fraction=0.25";
  // Before: "data.train_y: missing: data.train_x is a .npy file, so the labels need their own file".
  CHECK(error_of([&] { app::load_dataset(config_with({"data.format=npy", "data.train_x=" + csv, frac})); }) ==
        "data.train_x " + csv +
            ": holds text (a CSV table?), but data.format: npy reads a .npy array here: for a CSV table set "
            "data.format: csv and data.label_column");
  // Before: "... not a text CSV file (it holds NUL bytes)".
  const std::string x = (dir / "x.npy").string();
  CHECK(starts_with(error_of([&] {
                      app::load_dataset(config_with({"data.format=csv", "data.train_x=" + x, "data.label_column=label", frac}));
                    }),
                    "data.train_x " + x + ": is a .npy array, but data.format: csv reads a CSV table here"));
  // A .npy array named .npz, an .npz archive named .npy, a gzip'd CSV.
  fs::copy_file(dir / "x.npy", dir / "x.npz");
  test::write_file(dir / "d.npy", test::zip_bytes({{"x_train.npy", test::npy_f32({1, 6}, std::vector<float>(6, 0.f))}}, false));
  test::write_file(dir / "t.npy", std::string("\x1f\x8b\x08\x00", 4) + std::string(20, '\0'));
  CHECK(error_of([&] { app::load_dataset(config_with({"data.train_x=" + (dir / "x.npz").string(), frac})); }) ==
        "data.train_x " + (dir / "x.npz").string() +
            ": is a .npy array, but data.format npy (guessed from data.train_x's extension) reads an .npz archive here: a "
            ".npy array needs a name ending in .npy");
  CHECK(starts_with(error_of([&] {
                      app::load_dataset(config_with({"data.train_x=" + (dir / "d.npy").string(), "data.train_y=" + (dir / "y.npy").string(), frac}));
                    }),
                    "data.train_x " + (dir / "d.npy").string() + ": is a zip archive (an .npz?), but data.format npy"));
  CHECK(starts_with(error_of([&] {
                      app::load_dataset(config_with({"data.train_x=" + x, "data.train_y=" + (dir / "t.npy").string(), frac}));
                    }),
                    "data.train_y " + (dir / "t.npy").string() + ": is gzip-compressed (decompress it first)"));
  test::write_file(dir / "empty.npy", "");
  CHECK(error_of([&] { app::load_dataset(config_with({"data.train_x=" + (dir / "empty.npy").string(), frac})); }) ==
        "data.train_x " + (dir / "empty.npy").string() + ": the file is empty");
  fs::remove_all(dir);
}

TEST_CASE("4: keys of another data format are refused with their line, not ignored") {
  const auto error = [](std::vector<std::string> sets) { return error_of([&] { config_with(sets); }); };
  // Before: accepted, and data.label_column silently ignored.
  CHECK(starts_with(error({"data.train_x=x.npy", "data.train_y=y.npy", "data.label_column=label"}),
                    "--set 'data.label_column=label' (over rough.yaml): data.label_column: applies to data.format csv "
                    "only, and the data is npy (guessed from data.train_x's extension): the labels come from data.train_y"));
  CHECK(starts_with(error({"data.format=npy", "data.train_x=x.bin", "data.train_y=y.npy", "data.label_column=label"}),
                    "--set 'data.label_column=label' (over rough.yaml): data.label_column: applies to data.format csv "
                    "only, and data.format is npy"));
  CHECK(error({"data.label_column=label"}).find("data.label_column: applies to data.format csv only, and the data is idx") !=
        std::string::npos);
  CHECK(error({"data.train_x=t.csv", "data.label_column=label", "data.train_y=y.npy"})
            .find("data.train_y: applies to data.format npy only") != std::string::npos);
  CHECK(error({"data.test_y=y.npy"}).find("data.test_y: applies to data.format npy only") != std::string::npos);
  CHECK(error({"data.test_fraction=0.2"}).find("data.test_fraction: applies to data.format npy or csv") != std::string::npos);
  CHECK(error({"data.split_seed=3"}).find("data.split_seed: applies to data.format npy or csv") != std::string::npos);
  CHECK(error({"data.test_x=xt.npy"}).find("data.test_x: applies to data.format npy or csv") != std::string::npos);
  // In the file: its line.
  CHECK(starts_with(error_of([] { app::parse_config("model: {layers: [6, 8, 3]}\nrun: {steps: 3}\ndata:\n  test_fraction: 0.2\n", "f.yaml"); }),
                    "f.yaml:4: data.test_fraction: applies to data.format npy or csv, and the data is idx"));
  // The keys of the format in use, and the resolved config of an npy run, still read.
  const auto c = config_with({"data.train_x=x.npy", "data.train_y=y.npy", "data.test_fraction=0.2", "data.split_seed=4"});
  CHECK_NOTHROW(app::parse_config(app::to_yaml(c), "resolved.yaml"));
  CHECK_NOTHROW(config_with({"data.train_x=t.csv", "data.label_column=label", "data.test_fraction=0.2"}));
}

TEST_CASE("5: a bad CSV label or value is named by FILE:LINE like the table's other errors") {
  const auto dir = test::fresh_dir("rough-csv");
  const std::string csv = (dir / "t.csv").string();
  const auto load = [&](std::vector<std::string> sets) {
    sets.insert(sets.end(), {"data.train_x=" + csv, "data.label_column=label", "data.test_fraction=0.25"});
    return error_of([&] { app::load_dataset(config_with(sets)); });
  };
  // Before: "data.label_column t.csv (column label): label -1 at row 8 is not a class index ..." (row 8 is line 10).
  test::write_file(dir / "t.csv", csv_text(9, "-1"));
  CHECK(starts_with(load({}), "data.train_x " + csv + ":10: column 'label' (data.label_column): label -1 is not a class index in 0..255"));
  test::write_file(dir / "t.csv", "\n" + csv_text(9, "2.5"));  // a blank first line: the lines, not the rows, count
  CHECK(starts_with(load({}), "data.train_x " + csv + ":11: column 'label' (data.label_column): label 2.5 is not a class index"));
  test::write_file(dir / "t.csv", csv_text(4, "nan"));
  CHECK(load({"model.layers=[6, 8, 1]", "model.loss=mse"}) ==
        "data.train_x " + csv + ":5: column 'label' (data.label_column): target value nan: targets must be finite float32 values");
  test::write_file(dir / "t.csv", "a,b,c,d,e,f,label\n0,1,2,3,4,5,0\n0,1,inf,3,4,5,1\n");
  // Before: "... data row 2, column 'c': ...".
  CHECK(load({}) == "data.train_x " + csv + ":3: column 'c': feature value inf is not a finite float32");
  fs::remove_all(dir);
}

TEST_CASE("6: numeric options of every subcommand name their bound in words") {
  app::ProfileRequest profile;
  const auto profile_options = [&](CLI::App& a) { app::add_profile_options(a, profile); };
  // Before: "--steps: Value 0 not in range 0.000000 to 179769313486231570814527423731704356798070567525844996598917...".
  CHECK(cli_error(profile_options, "--steps 0") == "--steps: must be >= 1 (got 0)");
  CHECK(cli_error(profile_options, "--warmup=-1") == "--warmup: must be >= 0 (got -1)");
  CHECK(cli_error(profile_options, "--steps 2.5") == "--steps: '2.5' is not an integer");
  CHECK(cli_error(profile_options, "--steps 7 --warmup 0") == "(no error)");
  CHECK(profile.steps == 7);

  app::BenchRequest bench;
  const auto bench_options = [&](CLI::App& a) { app::add_bench_options(a, bench); };
  CHECK(cli_error(bench_options, "--steps 0") == "--steps: must be >= 1 (got 0)");  // before: accepted
  CHECK(cli_error(bench_options, "--repeats 0") == "--repeats: must be >= 1 (got 0)");
  CHECK(cli_error(bench_options, "--warmup=-5") == "--warmup: must be >= 0 (got -5)");
  CHECK(cli_error(bench_options, "--depth 17") == "--depth: must be <= 16 (got 17)");
  CHECK(cli_error(bench_options, "--steps-per-launch 0") == "--steps-per-launch: must be >= 1 (got 0)");
  CHECK(cli_error(bench_options, "--multi-step=-1") == "--multi-step: must be >= 0 (got -1)");

  app::PredictRequest predict;
  const auto predict_options = [&](CLI::App& a) { app::add_predict_options(a, predict); };
  CHECK(cli_error(predict_options, "--checkpoint c --input x.npy -o p.npy --batch-size 0") ==
        "--batch-size: must be >= 1 (got 0)");

  app::InspectRequest inspect;
  inspect.world_size = -1;
  CHECK(starts_with(error_of([&] { app::run_inspect(config_with({}), inspect); }), "inspect: --world-size must be >= 0 (got -1"));
}

TEST_CASE("7: export prints the input scaling as code a reader can paste: x * 4 - 2, not x * 4 + -2") {
  exporting::ExportedMlp m;
  m.input_scale = 0.0127;
  m.input_shift = -0.4242;
  CHECK(exporting::input_scaling_text(m) == "x * 0.0127 - 0.4242");
  m.input_shift = 0.5;
  CHECK(exporting::input_scaling_text(m) == "x * 0.0127 + 0.5");
  m.input_shift = 0;
  CHECK(exporting::input_scaling_text(m) == "x * 0.0127");

  // End to end: a model trained on normalised floats ((x - 0.5) / 0.25 = x * 4 - 2), then exported.
  const auto dir = test::fresh_dir("rough-export");
  write_npy_pair(dir);
  const auto checkpoint = (dir / "m.sgck").string();
  app::run_training(config_with({"data.train_x=" + (dir / "x.npy").string(), "data.train_y=" + (dir / "y.npy").string(),
                                 "data.test_fraction=0.25", "data.normalize=true", "data.mean=0.5", "data.std=0.25",
                                 "run.checkpoint=" + checkpoint, "run.out_dir=" + (dir / "run").string()}));
  app::ExportRequest request;
  request.checkpoint = checkpoint;
  request.format = "safetensors";
  request.out = (dir / "m.safetensors").string();
  const auto log = logged([&] { app::run_export(request); });
  CHECK(log.find("it expects inputs scaled as x * 4 - 2 (6 features") != std::string::npos);
  CHECK(log.find("+ -") == std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("8: --set run.steps over an epochs config trains steps instead (and the reverse), saying so") {
  const std::string epochs = "model: {layers: [6, 8, 3]}\nrun: {epochs: 2}\n";
  app::TrainConfig c;
  // Before: "--set 'run.steps=50' (over rough.yaml): run.steps: set exactly one of run.steps and run.epochs ...".
  const auto log = logged([&] { c = config_with({"run.steps=50"}, epochs); });
  CHECK(c.run.steps == 50);
  CHECK(c.run.epochs == 0);
  CHECK(log.find("--set 'run.steps=50' replaces run.epochs: 2 of rough.yaml: training by steps instead of epochs") !=
        std::string::npos);
  const auto reverse = config_with({"run.epochs=3"}, "model: {layers: [6, 8, 3]}\nrun: {steps: 100}\n");
  CHECK(reverse.run.epochs == 3);
  CHECK(reverse.run.steps == 0);
  // Both on the command line, or a zero: the rule stands.
  CHECK(error_of([&] { config_with({"run.steps=50", "run.epochs=1"}, epochs); }).find("set exactly one of") != std::string::npos);
  CHECK(error_of([&] { config_with({"run.steps=0"}, epochs); }) == "(no error)");
  CHECK(logged([&] { config_with({"run.steps=0"}, epochs); }).empty());
}

TEST_CASE("9: a failed atomic write names the file asked for and its temp file") {
  const auto dir = test::fresh_dir("rough-write");
  const auto target = dir / "out.bin";
  const auto tmp = fs::path(target.string() + ".tmp." + std::to_string(::getpid()));
  fs::create_directories(tmp);  // the temp file cannot be created: a folder is in its place
  // Before: "DIR/out.bin.tmp.PID: cannot create: Is a directory" (the temp file only).
  CHECK(error_of([&] { io::write_file_atomically(target, "bytes"); }) ==
        target.string() + ": cannot write (creating the temp file " + tmp.string() + "): Is a directory");
  fs::remove(tmp);
  if (fs::exists("/dev/full")) {
    fs::create_symlink("/dev/full", tmp);  // every write: ENOSPC
    CHECK(error_of([&] { io::write_file_atomically(target, "bytes"); }) ==
          target.string() + ": cannot write (writing the temp file " + tmp.string() + "): No space left on device");
    CHECK_FALSE(fs::exists(fs::symlink_status(tmp)));  // removed
  }
  fs::remove_all(dir);
}

TEST_CASE("10: loss.svg has no -0 tick and a log axis for losses over decades, profile.svg fits its labels") {
  report::Series s{"loss", {0, 1, 2, 3}, {0.01, 0.5, 1.2, 2.0}};
  const auto linear = report::render_svg({"t", "step", "loss", false, false}, {s});
  CHECK(linear.find(">-0<") == std::string::npos);  // before: the padded axis' zero tick read "-0"
  CHECK(linear.find(">0<") != std::string::npos);

  const auto dir = test::fresh_dir("rough-plot");
  report::MetricsLog regression;
  for (int step = 0; step <= 10; ++step)  // 2.0 down to 0.0002: four decades
    regression.add({step * 100, 2.0 * std::pow(0.4, step), 2.5 * std::pow(0.4, step)});
  regression.write_loss_plot(dir, "regression");  // run.loss_plot_scale: auto
  const std::string auto_svg = io::read_file(dir / "loss.svg");
  CHECK(auto_svg.find("loss / error (log scale)") != std::string::npos);  // before: linear, late losses flat at 0
  CHECK(regression.loss_plot_svg("r", report::LossPlotScale::linear).find("(log scale)") == std::string::npos);
  report::MetricsLog classifier;  // a span under two decades stays linear; an error of 0 cannot go on a log axis
  classifier.add({0, 2.3, 2.2, 0.1});
  classifier.add({100, 0.3, 0.35, 1.0});
  CHECK(classifier.loss_plot_svg("c").find("(log scale)") == std::string::npos);
  CHECK(classifier.loss_plot_svg("c", report::LossPlotScale::log).find("(log scale)") != std::string::npos);
  CHECK(report::loss_plot_scale("auto") == report::LossPlotScale::automatic);
  CHECK_THROWS_AS(report::loss_plot_scale("cubic"), std::invalid_argument);
  CHECK(error_of([] { config_with({"run.loss_plot_scale=cubic"}); }).find("run.loss_plot_scale: 'cubic' is not one of linear, log, auto") !=
        std::string::npos);
  CHECK(config_with({"run.loss_plot_scale=log"}).run.loss_plot_scale == "log");
  fs::remove_all(dir);

  report::ProfileReport profile;
  profile.config = "configs/a_rather_long_config_name_for_a_profile.yaml";
  profile.backend = "cuda (NVIDIA H100 80GB HBM3, sm_90)";
  profile.method = "CUDA events around each launch of the captured step replayed one launch at a time, 50 steps after "
                   "20 warm-up steps, medians per launch";
  report::ProfileRow row;
  row.index = 12;
  row.name = "one_pass_backward_column_strips_multicast";
  row.ops = "matmul+bias_add+relu_grad+sgd_update+matmul_grad";
  row.median_us = 3.5;
  profile.rows.push_back(row);
  const auto svg = report::to_svg(profile);
  const std::string label = "12 one_pass_backward_column_strips_multicast (matmul+bias_add+relu_grad+sgd_update+matmul_grad)";
  CHECK(svg.find(">" + label + "<") != std::string::npos);  // before: cut to 52 characters, "..."
  std::smatch m;
  REQUIRE(std::regex_search(svg, m, std::regex("<text x=\"(\\d+)\" y=\"\\d+\" text-anchor=\"end\">12 ")));
  CHECK(std::stoi(m[1]) >= 7 * static_cast<int>(label.size()));  // the right-aligned label starts inside the image
  // The subtitle wraps at the image's width instead of running off it.
  REQUIRE(std::regex_search(svg, m, std::regex("<svg [^>]*width=\"(\\d+)\"")));
  const int width = std::stoi(m[1]);
  const std::regex left_text("<text x=\"10\" y=\"\\d+\"[^>]*>([^<]*)</text>");
  for (std::sregex_iterator it(svg.begin(), svg.end(), left_text), end; it != end; ++it)
    CHECK(10 + 7 * static_cast<int>((*it)[1].length()) <= width);
}
