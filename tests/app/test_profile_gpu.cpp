// `stepgraph profile` on the GPU: the per-launch table adds up to the step.
#include <doctest/doctest.h>

#include <cmath>
#include <random>

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

// Tolerance: each launch timed between its own event pair runs without the
// overlap of programmatic dependent launch and pays an event's cost, so the
// sum of the launches' medians may exceed the step timed with events only at
// its ends; it must stay within 25% + 2 us per launch of that stream step
// time, and not fall below 75% of it (launches missing from the table).
TEST_CASE("CUDA profile: the sum of the launches is within 25% + 2 us per launch of the stream step") {
  for (const char* config : {"configs/mnist_mlp.yaml", "configs/parity_reference.yaml"}) {
    INFO(config);
    const auto out = std::filesystem::temp_directory_path() / ("stepgraph-profile-gpu-" + std::to_string(std::random_device{}()));
    const auto c = app::load_config(sg::test::source_dir() / config,
                                    {"data.dir=" + sg::test::mnist_dir().string(), "run.out_dir=" + out.string(), "backend.kind=cuda"});
    app::ProfileRequest req;
    req.steps = 30;
    req.warmup = 20;
    req.floors = false;
    report::RunTiming timing;
    const auto res = app::profile_config(c, req, timing);
    const auto& rep = res.report;
    REQUIRE(!rep.rows.empty());
    for (const auto& row : rep.rows) {
      CHECK(row.median_us > 0);
      CHECK(!row.name.empty());
    }
    const double sum = rep.sum_median_us();
    const double stream = total(rep, "stream step, no events between launches");
    MESSAGE(config << ": " << rep.rows.size() << " launches, sum " << sum << " us, stream step " << stream << " us");
    CHECK(sum <= 1.25 * stream + 2.0 * double(rep.rows.size()));
    CHECK(sum >= 0.75 * stream);
    std::filesystem::remove_all(out);
  }
}
