// `stepgraph profile` on the CPU backend: the trace has what Perfetto needs,
// the per-unit table adds up to the step, and the command writes its files.
#include <doctest/doctest.h>

#include <cmath>
#include <random>

#include <nlohmann/json.hpp>

#include "apps/config/train_config.hpp"
#include "apps/profile_command.hpp"
#include "apps/report/run_timing.hpp"
#include "apps/report/trace_json.hpp"
#include "runtime/io/atomic_file.hpp"
#include "tests/support/test_data.hpp"
#ifdef STEPGRAPH_HAVE_CUDA
#include "apps/profile_stream_model.hpp"
#endif

using namespace sg;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir() { return fs::temp_directory_path() / ("stepgraph-profile-" + std::to_string(std::random_device{}())); }

app::TrainConfig ci_config(const fs::path& out) {
  return app::load_config(sg::test::source_dir() / "configs/ci_small.yaml",
                          {"data.dir=" + sg::test::mnist_dir_or_skip().string(), "run.out_dir=" + out.string()});
}

// The fields the Chrome trace-event format requires (and Perfetto's importer
// reads): every event has name, ph, pid, tid; "X" events a numeric ts and
// dur >= 0 (microseconds) and a cat; "M" metadata events args.name.
void check_trace(const json& t) {
  REQUIRE(t.is_object());
  REQUIRE(t.contains("traceEvents"));
  REQUIRE(t["traceEvents"].is_array());
  CHECK(t["displayTimeUnit"] == "ns");
  int complete = 0, metadata = 0;
  for (const auto& e : t["traceEvents"]) {
    REQUIRE(e.is_object());
    REQUIRE(e.contains("name"));
    REQUIRE(e["name"].is_string());
    REQUIRE(e.contains("ph"));
    REQUIRE(e["pid"].is_number_integer());
    REQUIRE(e["tid"].is_number_integer());
    if (e["ph"] == "X") {
      ++complete;
      REQUIRE(e["ts"].is_number());
      REQUIRE(e["dur"].is_number());
      CHECK(e["ts"].get<double>() >= 0);
      CHECK(e["dur"].get<double>() >= 0);
      CHECK(e["cat"].is_string());
      CHECK(e["args"].is_object());
    } else {
      REQUIRE(e["ph"] == "M");
      ++metadata;
      CHECK((e["name"] == "process_name" || e["name"] == "thread_name"));
      CHECK(e["args"]["name"].is_string());
    }
  }
  CHECK(complete > 0);
  CHECK(metadata > 0);
}

}  // namespace

TEST_CASE("trace_json: complete events and track names in the Chrome trace-event format") {
  const auto t = report::trace_json({{"cublaslt_matmul", "launch", 1.5, 3.25, 1, 1, {{"nodes", {"3 matmul"}}, {"shapes", "h[32,128] f16"}}},
                                     {"softmax_xent", "launch", 5.0, 0.0, 1, 2, json::object()}},
                                    {{1, 1, "p", "stream 1"}, {1, 2, "p", "stream 2"}});
  check_trace(t);
  CHECK(t["traceEvents"].size() == 6);  // 2 tracks x 2 metadata + 2 events
  const auto& e = t["traceEvents"][4];
  CHECK(e["ts"] == 1.5);
  CHECK(e["dur"] == 3.25);
  CHECK(e["args"]["shapes"] == "h[32,128] f16");
  // What is written is what parses back.
  CHECK(json::parse(t.dump()) == t);
}

TEST_CASE("run timing: phases add up in order and time what they wrap") {
  report::RunTiming timing;
  timing.add("a", 0.5);
  const int v = timing.time("b", [] { return 7; });
  timing.add("a", 0.25);
  CHECK(v == 7);
  REQUIRE(timing.phases().size() == 2);
  CHECK(timing.phases()[0].first == "a");
  CHECK(timing.phases()[0].second == doctest::Approx(0.75));
  CHECK(timing.sum() >= 0.75);
  CHECK(timing.format("t").find("since program start") != std::string::npos);
}

TEST_CASE("run timing: parts show under their phase and are not counted twice") {
  report::RunTiming timing;
  timing.add("build", 1.0);
  timing.add_part("build", "capture", 0.25);
  timing.add_part("build", "upload", 0.5);
  timing.add("train", 2.0);
  CHECK(timing.sum() == doctest::Approx(3.0));
  const auto parts = timing.parts_of("build");
  REQUIRE(parts.size() == 2);
  CHECK(parts[1].first == "upload");
  CHECK(timing.parts_of("train").empty());
  const std::string text = timing.format("t");
  const auto build = text.find("build"), capture = text.find("capture"), train = text.find("train");
  CHECK(build < capture);
  CHECK(capture < train);
  CHECK(timing.to_json()["phases"][0]["parts"].size() == 2);
}

// Only what does not depend on speed is asserted (a ratio of timings is a
// timing too): min <= median per row, shares that add up to 1, the matmul
// FLOPs read off the graph, the whole-step total present. The rows' sum
// against the whole step is printed for the reader.
TEST_CASE("CPU profile of configs/ci_small.yaml: rows, shares, FLOPs and the whole-step total are consistent") {
  app::ProfileRequest req;
  req.steps = 40;
  req.warmup = 5;
  report::RunTiming timing;
  const auto res = app::profile_config(ci_config(fresh_dir()), req, timing);
  const auto& rep = res.report;
  REQUIRE(rep.rows.size() >= 5);
  double sum_min = 0, shares = 0;
  for (const auto& row : rep.rows) {
    CHECK(row.median_us >= row.min_us);
    CHECK(!row.nodes.empty());
    sum_min += row.min_us;
    shares += row.share;
  }
  CHECK(shares == doctest::Approx(1.0));
  double step_min = 0;
  for (const auto& t : rep.totals)
    if (t.name == "whole step, CpuExecutor::run (min)") step_min = t.us;
  REQUIRE(step_min > 0);
  MESSAGE("sum of rows (min) " << sum_min << " us, whole step (min) " << step_min << " us (printed, not asserted)");
  // The matmuls' FLOPs are read off the graph: 784-64-10 at batch 32 is
  // 2*32*(784*64 + 64*10) forward, the same again for the weight gradients,
  // plus the second layer's dgrad (2*32*10*64; the first layer has none).
  double flops = 0;
  for (const auto& row : rep.rows) flops += row.flops;
  CHECK(flops == doctest::Approx(2 * 2.0 * 32 * (784 * 64 + 64 * 10) + 2.0 * 32 * 10 * 64));
  check_trace(report::trace_json(res.events, res.tracks));
  CHECK(timing.phases().front().first.find("data load") != std::string::npos);
}

TEST_CASE("stepgraph profile on configs/ci_small.yaml writes the table, CSV, JSON, SVG and trace") {
  const auto out = fresh_dir();
  app::ProfileRequest req;
  req.steps = 5;
  req.warmup = 1;
  req.out_dir = (out / "p").string();
  req.trace = (out / "t" / "trace.json").string();
  CHECK(app::run_profile(ci_config(out), req) == 0);
  for (const char* f : {"profile.txt", "profile.csv", "profile.json", "profile.svg"}) {
    INFO(f);
    CHECK(fs::file_size(out / "p" / f) > 100);
  }
  check_trace(json::parse(io::read_file(out / "t" / "trace.json")));
  const auto doc = json::parse(io::read_file(out / "p" / "profile.json"));
  CHECK(doc["rows"].size() >= 5);
  CHECK(doc["phases"]["phases"].size() >= 3);
  CHECK(io::read_file(out / "p" / "profile.svg").find("<svg") == 0);
  const auto csv = io::read_file(out / "p" / "profile.csv");
  CHECK(csv.rfind("index,lowering,nodes", 0) == 0);
  fs::remove_all(out);
}

#ifdef STEPGRAPH_HAVE_CUDA
TEST_CASE("the CUDA profile's modeled step: the medians scaled to the stream step, laid on the plan's streams") {
  // Launches 0, 1 and 4 on the step's stream; 2 and 3 forked before launch 2 onto the two gradient streams.
  cuda::StreamPlan plan;
  plan.on_communication.assign(5, false);
  plan.on_gradient_stream = {false, false, true, true, false};
  plan.gradient_lane = {0, 0, 0, 1, 0};
  plan.fork_before = {0, 0, 2, 2, 0};
  plan.join_before.assign(5, 5);
  plan.waits_for.assign(5, {});
  std::vector<report::ProfileRow> rows;
  for (const double us : {2.0, 3.0, 10.0, 6.0, 1.0}) {
    report::ProfileRow row;
    row.index = static_cast<int>(rows.size());
    row.median_us = us;
    rows.push_back(row);
  }
  nlohmann::json extra;
  // Measured on one stream in half the sum of the event-timed launches: each launch counts half.
  const report::ProfileTotal t = app::stream_model_total(plan, rows, 11.0, extra);
  CHECK(t.us == doctest::Approx(7.5));  // 1 + 1.5, then launch 2's 5 on the first gradient stream
  CHECK(t.note.find("x 0.50") != std::string::npos);
  CHECK(t.note.find("the end waits on the gradient 1 stream") != std::string::npos);
  CHECK(t.note.find("critical path: L0 L1 L2(gradient 1)") != std::string::npos);
  REQUIRE(extra["stream_model"]["launches"].size() == 5);
  CHECK(extra["stream_model"]["launches"][3]["stream"] == "gradient 2");
  CHECK(extra["stream_model"]["launches"][3]["end_us"].get<double>() == doctest::Approx(5.5));
  CHECK(extra["stream_model"]["critical_path"] == nlohmann::json::array({0, 1, 2}));
}
#endif
