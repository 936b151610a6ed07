// BackendOptions::large_updates_apart: an update-rule update that moves 32 MB
// or more whose gradient is complete before the step's last gradient gets a
// launch of its own, which the stream plan runs on the
// gradient stream beside the rest of the backward; the step advance stays on
// the launch after the last gradient, and with the option off (or with
// clipping, whose scale needs every gradient) one launch takes every update.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include "runtime/cuda/stream_plan.hpp"
#include "tests/runtime/schedule_test_support.hpp"
#include "tests/runtime/stream_order.hpp"

using namespace sg;
using namespace sg::schedule_test;

namespace {

Graph adamw_mlp(double clip = 0.0) {
  MlpSpec spec;
  spec.layers = {784, 2048, 2048, 10};
  spec.batch = 128;
  spec.weight_dtype = DType::f32;
  OptimizerSpec adamw;
  adamw.kind = OptimizerKind::adamw;
  adamw.weight_decay = 0.01;
  adamw.clip_grad_norm = clip;
  return build_training_stages(spec, adamw).fused;
}

std::vector<std::size_t> update_launches(const Schedule& s) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < s.launches.size(); ++i)
    if (name_of(s.launches[i]) == "update_multi_tensor") out.push_back(i);
  return out;
}

}  // namespace

TEST_CASE("a large parameter whose gradient is ready early is updated apart, beside the rest of the backward") {
  const Graph g = adamw_mlp();
  const Lowered lowered = lower(g, BackendOptions{});
  const Schedule& s = lowered.schedule;
  const auto launches = update_launches(s);
  REQUIRE(launches.size() == 2);
  const Launch &apart = s.launches[launches[0]], &rest = s.launches[launches[1]];
  CHECK(apart.lowering->describe(g, apart).find("1 tensors,one pass each,apart") != std::string::npos);
  CHECK(apart.riders.empty());
  CHECK(rest.riders.size() == 1);  // the step advance, after every launch that reads the step
  CHECK(updates(apart, g.value_named("w2")));  // [2048, 2048]: its gradient before W1's
  CHECK(updates(rest, g.value_named("w1")));   // [2048, 784]: the last gradient
  CHECK(updates(rest, g.value_named("step")));
  // W1's weight gradient, the step's last one.
  std::size_t last_gradient = 0;
  for (std::size_t i = 0; i < s.launches.size(); ++i)
    for (ValueId v : rest.reads)
      if (writes(s.launches[i], v)) last_gradient = std::max(last_gradient, i);
  REQUIRE(last_gradient > 0);
  for (const std::int64_t lanes : {1, 2}) {
    CAPTURE(lanes);
    BackendOptions o;
    o.gradient_streams = lanes;
    const cuda::StreamPlan plan = cuda::plan_streams(g, s, o);
    test::check_stream_order(s, plan);
    // Beside the last gradient: neither waits for the other. The advance waits for its read of the step.
    const auto before = test::finished_before(s, plan);
    CHECK_FALSE(before[launches[0]][last_gradient]);
    CHECK_FALSE(before[last_gradient][launches[0]]);
    CHECK(before[launches[1]][launches[0]]);
  }
}

TEST_CASE("without large_updates_apart, or with clipping, one launch takes every update-rule update") {
  BackendOptions off;
  off.large_updates_apart = false;
  const Graph g = adamw_mlp();
  CHECK(update_launches(lower(g, off).schedule).size() == 1);
  const Graph clipped = adamw_mlp(1.0);
  CHECK(update_launches(lower(clipped, BackendOptions{}).schedule).size() == 1);
}
