// The model of a step's launches on its streams (runtime/cuda/stream_timeline.hpp)
// that `stepgraph profile` reports: hand-made plans with the times worked out
// by hand (a fork after what the step's stream has run, the two gradient
// lanes side by side, a wait across them, a join), and the plans of real
// schedules: one stream is the sum of the launches, side streams never make
// the step longer, and the critical path is a chain of launches, each
// starting where the one before it ends, from the step's start to its end.
#include <doctest/doctest.h>

#include <numeric>

#include "models/sequential_program.hpp"
#include "runtime/cuda/lowering.hpp"
#include "runtime/cuda/stream_timeline.hpp"
#include "tests/runtime/channels_last_networks.hpp"
#include "tests/runtime/report_cnn.hpp"

using namespace sg;
using cuda::TimelineStream;

namespace {

// Launches 0, 1 and 4 on the step's stream; 2 and 3 forked before launch 2 onto lanes lane2 and lane3, joined at
// the step's end.
cuda::StreamPlan five_launches(int lane2, int lane3) {
  cuda::StreamPlan p;
  p.on_communication.assign(5, false);
  p.on_gradient_stream = {false, false, true, true, false};
  p.gradient_lane = {0, 0, lane2, lane3, 0};
  p.fork_before = {0, 0, 2, 2, 0};
  p.join_before.assign(5, 5);
  p.waits_for.assign(5, {});
  return p;
}

const std::vector<double> kFive = {2, 3, 10, 6, 1};

}  // namespace

TEST_CASE("stream timeline: a fork starts after what the step's stream has run, two lanes run side by side") {
  const auto t = cuda::model_stream_timeline(five_launches(0, 1), kFive);
  CHECK(t.start == std::vector<double>{0, 2, 5, 5, 5});
  CHECK(t.end == std::vector<double>{2, 5, 15, 11, 6});
  CHECK(t.stream[2] == TimelineStream::gradient_1);
  CHECK(t.stream[3] == TimelineStream::gradient_2);
  CHECK(t.step == 15);
  CHECK(t.critical_path == std::vector<std::size_t>{0, 1, 2});
  // On one lane the second waits for the first.
  const auto one = cuda::model_stream_timeline(five_launches(0, 0), kFive);
  CHECK(one.start[3] == 15);
  CHECK(one.step == 21);
  CHECK(one.critical_path == std::vector<std::size_t>{0, 1, 2, 3});
  // Across the lanes, a wait.
  auto waiting = five_launches(0, 1);
  waiting.waits_for[3] = {2};
  const auto w = cuda::model_stream_timeline(waiting, kFive);
  CHECK(w.start[3] == 15);
  CHECK(w.after[3] == 2);
  CHECK(w.step == 21);
}

TEST_CASE("stream timeline: the step's stream waits at a join, a communication launch forks where it sits") {
  auto p = five_launches(0, 1);
  p.join_before[2] = 4;  // launch 4 reads what launch 2 writes
  const auto t = cuda::model_stream_timeline(p, kFive);
  CHECK(t.start[4] == 15);
  CHECK(t.after[4] == 2);
  CHECK(t.step == 16);
  CHECK(t.critical_path == std::vector<std::size_t>{0, 1, 2, 4});
  // Launch 1 on the communication stream instead, waiting for nothing else: it starts after launch 0.
  auto c = five_launches(0, 1);
  c.on_communication[1] = true;
  c.join_before[1] = 5;
  const auto ct = cuda::model_stream_timeline(c, kFive);
  CHECK(ct.start[1] == 2);
  CHECK(ct.stream[1] == TimelineStream::communication);
  CHECK(ct.start[2] == 2);  // forked before launch 2: the step's stream has run launch 0 only
  CHECK(ct.start[4] == 2);
  CHECK(ct.step == 12);
  CHECK_THROWS(cuda::model_stream_timeline(c, {1, 2}));  // a duration per launch
}

TEST_CASE("stream timeline on real plans: one stream sums the launches, side streams never lengthen the step, "
          "the critical path is a chain from the start to the end") {
  std::vector<TrainingProgram> programs;
  programs.push_back(build_sequential_program(test::report_cnn(), 1280, 200, ProgramTarget::cuda));
  for (const int variant : {0, 1}) programs.push_back(test::channels_last_training_program(variant));
  for (const TrainingProgram& p : programs) {
    const Graph& g = p.train;
    const auto keep = cuda::cuda_lowerings(BackendOptions{}, /*device_present=*/false);
    const Schedule s = build_schedule(g, cuda::as_lowerings(keep));
    std::vector<double> durations;
    for (std::size_t i = 0; i < s.launches.size(); ++i) durations.push_back(1.0 + double((i * 7) % 5));
    const double sum = std::accumulate(durations.begin(), durations.end(), 0.0);
    BackendOptions off, one, two;
    off.weight_gradient_stream = off.independent_launch_stream = false;
    one.gradient_streams = 1;
    two.gradient_streams = 2;
    const auto serial = cuda::model_stream_timeline(cuda::plan_streams(g, s, off), durations);
    CHECK(serial.step == doctest::Approx(sum));
    CHECK(serial.critical_path.size() == s.launches.size());
    const auto single = cuda::model_stream_timeline(cuda::plan_streams(g, s, one), durations);
    const auto lanes = cuda::model_stream_timeline(cuda::plan_streams(g, s, two), durations);
    CHECK(single.step < sum);  // the weight gradients overlap the chain
    CHECK(lanes.step <= single.step);
    for (const auto* t : {&serial, &single, &lanes}) {
      REQUIRE_FALSE(t->critical_path.empty());
      CHECK(t->start[t->critical_path.front()] == 0);
      CHECK(t->end[t->critical_path.back()] == doctest::Approx(t->step));
      for (std::size_t k = 1; k < t->critical_path.size(); ++k)
        CHECK(t->start[t->critical_path[k]] == doctest::Approx(t->end[t->critical_path[k - 1]]));
      for (std::size_t k = 0; k < s.launches.size(); ++k) CHECK(t->end[k] <= t->step);
    }
  }
}
