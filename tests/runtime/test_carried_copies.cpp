// The update stage writes an fp32 master weight's compute copy for the next
// step (Launch::carries, runtime/cuda/lowerings/carried_copies.hpp): which
// launch carries which cast, that every reader of a copy runs before it (in
// schedule order and through the streams), that a read after it is an order
// error, and that the memory plan keeps the copies' bytes through the step.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include "runtime/cuda/stream_plan.hpp"
#include "tests/runtime/schedule_test_support.hpp"
#include "tests/runtime/stream_order.hpp"

using namespace sg;
using namespace sg::schedule_test;

namespace {

Graph adamw_mlp(DType weights) {
  MlpSpec spec;
  spec.layers = {784, 2048, 2048, 10};
  spec.batch = 128;
  spec.weight_dtype = weights;
  OptimizerSpec adamw;
  adamw.kind = OptimizerKind::adamw;
  adamw.weight_decay = 0.01;
  return build_training_stages(spec, adamw).fused;
}

std::vector<std::size_t> carriers(const Schedule& s) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < s.launches.size(); ++i)
    if (!s.launches[i].carries.empty()) out.push_back(i);
  return out;
}

}  // namespace

TEST_CASE("AdamW with fp32 master weights: the multi-tensor update writes its weights' compute copies for the next "
          "step, after every reader of them") {
  const Graph g = adamw_mlp(DType::f32);
  BackendOptions one_update;  // (W2's update apart: test_update_apart.cpp)
  one_update.large_updates_apart = false;
  const Lowered lowered = lower(g, one_update);
  const Schedule& s = lowered.schedule;
  const auto carrying = carriers(s);
  REQUIRE(carrying.size() == 1);
  const std::size_t at = carrying.front();
  const Launch& update = s.launches[at];
  CHECK(name_of(update) == "update_multi_tensor");
  CHECK(update.lowering->describe(g, update).find("2 compute copies for the next step") != std::string::npos);
  REQUIRE(update.carries.size() == 2);  // W1 and W2 (W3 and the biases: their fused updates leave the casts)
  for (ValueId copy : update.carries) {
    CAPTURE(g.value(copy).name);
    const Node& cast = g.node(g.value(copy).producer);
    CHECK(cast.op == OpKind::cast);
    CHECK(g.value(copy).dtype == DType::f16);
    CHECK(updates(update, cast.inputs[0]));  // the copy of a parameter this launch updates
    CHECK(std::count(update.nodes.begin(), update.nodes.end(), cast.id) == 1);
    std::size_t readers = 0;
    for (std::size_t i = 0; i < s.launches.size(); ++i) {
      CHECK_FALSE(writes(s.launches[i], copy));
      if (reads(s.launches[i], copy)) {
        CHECK(i < at);
        ++readers;
      }
    }
    CHECK(readers >= 1);  // the forward (and W2's data gradient)
  }
  const auto counts = launch_counts(g, s);
  CHECK(counts.at("cast_params[4 tensors]") == 1);  // the biases and W3 only

  // A launch reading a copy after its carrier breaks the order.
  Schedule late = s;
  for (const Launch& l : s.launches)
    if (reads(l, update.carries.front())) {
      late.launches.push_back(l);
      break;
    }
  CHECK_THROWS_WITH_AS(check_schedule_order(g, late),
                       doctest::Contains("after it was written for the next step"), GraphError);

  // The copies hold their bytes from the step's first launch to its last, sharing them with no other buffer.
  const auto request = arena_request(g, s, sizes_of(g), std::vector<std::size_t>(s.aux.size(), 4096));
  const MemoryPlan plan = plan_memory(request.buffers);
  for (ValueId copy : update.carries) {
    const int buffer = request.buffer_of_value[static_cast<std::size_t>(copy)];
    REQUIRE(buffer >= 0);
    const auto b = static_cast<std::size_t>(buffer);
    CHECK(request.buffers[b].first == 0);
    CHECK(request.buffers[b].last == static_cast<int>(s.launches.size()) - 1);
    for (std::size_t other = 0; other < plan.slots.size(); ++other) {
      if (other == b) continue;
      const ArenaSlot &x = plan.slots[b], &y = plan.slots[other];
      CHECK((x.offset + x.bytes <= y.offset || y.offset + y.bytes <= x.offset));
    }
  }

  // Through the streams (one and two gradient lanes): every reader has finished when the carrier starts.
  for (const std::int64_t lanes : {1, 2}) {
    CAPTURE(lanes);
    BackendOptions o = one_update;
    o.gradient_streams = lanes;
    const cuda::StreamPlan streams = cuda::plan_streams(g, s, o);
    test::check_stream_order(s, streams);
    const auto before = test::finished_before(s, streams);
    for (std::size_t i = 0; i < at; ++i)
      for (ValueId copy : update.carries)
        if (reads(s.launches[i], copy)) CHECK(before[at][i]);
  }
}

TEST_CASE("fp16 weights carry nothing: there is no master to copy") {
  const Graph g = adamw_mlp(DType::f16);
  const Lowered lowered = lower(g, BackendOptions{});
  CHECK(carriers(lowered.schedule).empty());
}
