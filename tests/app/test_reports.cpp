// SVG plots, metrics files, the progress line, and the learning-rate schedule.
#include <doctest/doctest.h>

#include <cmath>
#include <random>

#include "apps/lr_schedule.hpp"
#include "apps/report/metrics_log.hpp"
#include "apps/report/progress.hpp"
#include "apps/report/svg_plot.hpp"
#include "runtime/io/atomic_file.hpp"

using namespace sg;

namespace {
std::size_t count(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (auto p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}
}  // namespace

TEST_CASE("an SVG plot has one polyline per series, escaped labels and a legend") {
  report::Series a{"graph <replay>", {128, 256, 512}, {10, 12, 20}}, b{"torch & co", {128, 256, 512}, {130, 140, 200}};
  const auto svg = report::render_svg({"speed", "width", "us", true, true}, {a, b});
  CHECK(svg.rfind("<?xml", 0) == 0);
  CHECK(svg.find("</svg>") != std::string::npos);
  CHECK(count(svg, "<polyline") == 2);
  CHECK(svg.find("graph &lt;replay&gt;") != std::string::npos);
  CHECK(svg.find("torch &amp; co") != std::string::npos);
  CHECK(count(svg, "<circle") == 6);
  report::Series bad{"bad", {1, 2}, {1}};
  CHECK_THROWS_AS(report::render_svg({}, {bad}), std::invalid_argument);
  report::Series negative{"neg", {1, 2}, {-1, 1}};
  CHECK_THROWS_AS(report::render_svg({"", "", "", false, true}, {negative}), std::invalid_argument);
}

TEST_CASE("metrics are written as CSV and JSON with empty/null for missing values") {
  const auto dir = std::filesystem::temp_directory_path() / ("stepgraph-metrics-" + std::to_string(std::random_device{}()));
  report::MetricsLog log;
  log.add({100, 0.5, NAN, NAN, 0.01, 1.5});
  log.add({200, 0.25, 0.3, 0.9, 0.01, 3.0});
  log.write(dir);
  log.write_loss_plot(dir, "run");
  const auto csv = io::read_file(dir / "metrics.csv");
  CHECK(csv.rfind("step,train_loss,test_loss,test_accuracy,lr,elapsed_s\n", 0) == 0);
  CHECK(csv.find("100,0.5,,,0.01,1.5\n") != std::string::npos);
  CHECK(csv.find("200,0.25,0.3,0.9,0.01,3\n") != std::string::npos);
  const auto json = io::read_file(dir / "metrics.json");
  CHECK(json.find("\"test_loss\": null") != std::string::npos);
  CHECK(count(io::read_file(dir / "loss.svg"), "<polyline") == 3);
  std::filesystem::remove_all(dir);
}

TEST_CASE("the progress line shows step, loss, throughput and ETA") {
  const auto line = report::format_progress({1200, 5000, 0.31214, 41234.4, 12.34, 4.12});
  CHECK(line == "step 1200/5000 | loss 0.3121 | 41234 samples/s | 12.3 us/step | ETA 4.1 s");
}

TEST_CASE("learning-rate schedules: warm-up, step decay, cosine") {
  app::OptimConfig o;
  o.lr = 0.1;
  CHECK(app::learning_rate_at(o, 500, 1000) == 0.1);
  CHECK_FALSE(app::schedule_varies(o));
  o.schedule.warmup_steps = 10;
  CHECK(app::learning_rate_at(o, 0, 1000) == doctest::Approx(0.01));
  CHECK(app::learning_rate_at(o, 9, 1000) == doctest::Approx(0.1));
  o.schedule.kind = "step";
  o.schedule.step_size = 100;
  o.schedule.gamma = 0.5;
  CHECK(app::learning_rate_at(o, 250, 1000) == doctest::Approx(0.025));
  o.schedule.kind = "cosine";
  o.schedule.min_lr = 0.001;
  CHECK(app::learning_rate_at(o, 10, 1010) == doctest::Approx(0.1));
  CHECK(app::learning_rate_at(o, 510, 1010) == doctest::Approx(0.0505));
  CHECK(app::learning_rate_at(o, 1010, 1010) == doctest::Approx(0.001));
}
