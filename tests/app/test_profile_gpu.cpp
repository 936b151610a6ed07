// `stepgraph profile` on the GPU: the per-launch table adds up to the step.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "apps/config/train_config.hpp"
#include "apps/profile_command.hpp"
#include "tests/support/test_data.hpp"

using namespace sg;

namespace {

double total(const report::ProfileReport& r, const std::string& name) {
  for (const auto& t : r.totals)
    if (t.name == name) return t.us;
  FAIL("no total named " << name);
  return 0;
}

}  // namespace

// Only what does not depend on speed is asserted (a ratio of timings is a
// timing too, and varies between an H100 and an H200): one row per launch of
// the step, in schedule order, no node in two rows,
// times that are positive with min <= median, shares that add up to 1, the
// matmul FLOPs the layer sizes give, and every total present. The timings
// themselves are printed for the reader.
TEST_CASE("CUDA profile: one row per launch, no node twice, shares and FLOPs that add up, every total present") {
  struct Case {
    const char* config;
    std::vector<double> layers;
    double batch;
  };
  for (const Case& c : {Case{"configs/mnist_mlp.yaml", {784, 1024, 1024, 10}, 128},
                        Case{"configs/parity_reference.yaml", {784, 128, 128, 128, 10}, 32}}) {
    INFO(std::string(c.config));
    const auto out = std::filesystem::temp_directory_path() / ("stepgraph-profile-gpu-" + std::to_string(std::random_device{}()));
    const auto config = app::load_config(sg::test::source_dir() / c.config,
                                         {"data.dir=" + sg::test::mnist_dir_or_skip().string(), "run.out_dir=" + out.string(), "backend.kind=cuda"});
    REQUIRE(config.model.layers == std::vector<std::int64_t>(c.layers.begin(), c.layers.end()));
    REQUIRE(config.data.batch_size == std::int64_t(c.batch));
    app::ProfileRequest req;
    req.steps = 30;
    req.warmup = 20;
    req.floors = false;
    report::RunTiming timing;
    const auto res = app::profile_config(config, req, timing);
    const auto& rep = res.report;
    REQUIRE(!rep.rows.empty());
    std::set<int> nodes;
    std::size_t node_count = 0;
    double shares = 0, flops = 0;
    for (std::size_t i = 0; i < rep.rows.size(); ++i) {
      const auto& row = rep.rows[i];
      CAPTURE(row.name);
      CHECK(row.index == int(i));
      CHECK(!row.name.empty());
      CHECK(!row.nodes.empty());
      CHECK(row.min_us > 0);
      CHECK(row.min_us <= row.median_us);
      CHECK(row.bytes > 0);
      nodes.insert(row.nodes.begin(), row.nodes.end());
      node_count += row.nodes.size();
      shares += row.share;
      flops += row.flops;
    }
    CHECK(node_count == nodes.size());  // no node in two rows
    CHECK(shares == doctest::Approx(1.0));
    // Forward and weight gradients of every layer, data gradients of all but the first.
    double forward = 0;
    for (std::size_t l = 0; l + 1 < c.layers.size(); ++l) forward += 2 * c.batch * c.layers[l] * c.layers[l + 1];
    CHECK(flops == doctest::Approx(2 * forward + forward - 2 * c.batch * c.layers[0] * c.layers[1]));
    CHECK(total(rep, "sum of launches (median each)") == doctest::Approx(rep.sum_median_us()));
    for (const char* name : {"step with per-launch events (median span)", "stream step, no events between launches",
                             "graph replay, one step per event pair", "graph replay, back to back (mean per step)"})
      CHECK(total(rep, name) > 0);
    // The modeled step (the launches laid on the plan's streams) overlaps what the stream step runs in turn.
    const double modeled = total(rep, "modeled step on the streams (no slowdown from overlap)");
    CHECK(modeled > 0);
    CHECK(modeled <= total(rep, "stream step, no events between launches") * (1 + 1e-9));
    MESSAGE(std::string(c.config) << ": " << rep.rows.size() << " launches, sum " << rep.sum_median_us() << " us, stream step "
                     << total(rep, "stream step, no events between launches") << " us (printed, not asserted)");
    std::filesystem::remove_all(out);
  }
}
