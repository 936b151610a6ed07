// Lowering the fused training graph into launches, and the memory plan.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>

#include "graph/training_graph.hpp"
#include "runtime/plan/memory_plan.hpp"
#include "runtime/plan/schedule.hpp"

using namespace sg;

namespace {

Graph reference_fused(double momentum = 0.0, DType weights = DType::f16) {
  MlpSpec spec;
  spec.layers = {784, 128, 128, 128, 10};
  spec.weight_dtype = weights;
  return build_training_stages(spec, {0.003, momentum, 0.0}).fused;
}

std::map<std::string, int> launch_counts(const Graph& g, const Schedule& s) {
  std::map<std::string, int> counts;
  for (const auto& l : s.launches) {
    std::string key(launch_kind_name(l.kind));
    if (l.kind == LaunchKind::matmul) key += std::string(":") + std::string(epilogue_name(l.epilogue)) +
                                             (l.target == MatmulTarget::output ? "" : "+sgd");
    if (l.kind == LaunchKind::single) key = std::string(op_name(g.node(l.nodes[0]).op));
    ++counts[key];
  }
  return counts;
}

std::vector<std::size_t> sizes_of(const Graph& g) {
  std::vector<std::size_t> bytes;
  for (const auto& v : g.values()) bytes.push_back(static_cast<std::size_t>(element_count(v.shape)) * dtype_size(v.dtype));
  return bytes;
}

}  // namespace

TEST_CASE("the reference training step lowers to 18 launches") {
  const Graph g = reference_fused();
  const Schedule s = build_schedule(g);
  auto counts = launch_counts(g, s);
  CHECK(counts["batch_fetch"] == 1);
  // The last hidden layer's mask is not kept: its dgrad (10 terms, the
  // classifier's) masks by the relu output it reads instead.
  CHECK(counts["matmul:relu_aux_bias"] == 2);
  CHECK(counts["matmul:relu_bias"] == 1);
  CHECK(counts["matmul:bias"] == 1);
  CHECK(counts["xent"] == 1);
  CHECK(counts["matmul:drelu"] == 3);
  CHECK(counts["matmul:none+sgd"] == 4);
  CHECK(counts["bias_grad_sgd"] == 4);
  CHECK(counts["advance_step"] == 1);
  CHECK(s.launches.size() == 18);
  CHECK(s.aux.size() == 2);
  int value_masked = 0;
  for (const auto& l : s.launches)
    if (l.mask_from_relu_output) {
      ++value_masked;
      CHECK(l.aux_read == -1);
      CHECK(std::find(l.reads.begin(), l.reads.end(), g.value_named("relu_2")) != l.reads.end());
    }
  CHECK(value_masked == 1);
  // Weight gradients never get a buffer: nothing writes grad_w*.
  for (const auto& l : s.launches)
    for (ValueId w : l.writes) CHECK(g.value(w).name.rfind("grad_w", 0) != 0);
  CHECK_NOTHROW(check_schedule_order(g, s));
  const std::string dump = dump_schedule(g, s);
  CHECK(dump.find("into=param(alpha=-lr,beta=1-lr*wd)") != std::string::npos);
}

TEST_CASE("the dgrad matmul reading a weight runs before that weight's fused update") {
  const Graph g = reference_fused();
  const Schedule s = build_schedule(g);
  std::map<std::string, std::size_t> update_at;
  for (std::size_t i = 0; i < s.launches.size(); ++i)
    for (ValueId u : s.launches[i].updates) update_at[g.value(u).name] = i;
  for (std::size_t i = 0; i < s.launches.size(); ++i)
    for (ValueId r : s.launches[i].reads) {
      auto it = update_at.find(g.value(r).name);
      if (it != update_at.end()) CHECK(i <= it->second);
    }
}

TEST_CASE("momentum routes the weight-gradient matmul into the velocity") {
  const Graph g = reference_fused(0.9);
  const Schedule s = build_schedule(g);
  int into_velocity = 0;
  for (const auto& l : s.launches) into_velocity += l.target == MatmulTarget::velocity_sgd;
  CHECK(into_velocity == 4);
}

TEST_CASE("an unfused graph lowers to one launch per node (but batch fetch stays fused)") {
  MlpSpec spec;
  spec.layers = {784, 64, 10};
  FusionOptions only_fetch{false, false, false, true};
  const Graph g = build_training_stages(spec, {0.1, 0.0, 0.0}, only_fetch).fused;
  const Schedule s = build_schedule(g);
  CHECK(s.launches.size() == g.nodes().size() - 2);  // 3 fetch nodes -> 1 launch
  CHECK(s.aux.empty());
  FusionOptions nothing{false, false, false, false};
  const Graph bare = build_training_stages(spec, {0.1, 0.0, 0.0}, nothing).fused;
  CHECK_THROWS_WITH_AS(build_schedule(bare), doctest::Contains("batch_fetch"), GraphError);
}

TEST_CASE("check_schedule_order catches a reordered schedule") {
  const Graph g = reference_fused();
  Schedule s = build_schedule(g);
  std::swap(s.launches[1], s.launches[2]);  // second layer before the first
  CHECK_THROWS_WITH_AS(check_schedule_order(g, s), doctest::Contains("before it is written"), GraphError);
}

TEST_CASE("memory plan: disjoint lifetimes share bytes, overlapping ones never do") {
  std::vector<BufferLifetime> buffers{{"a", 1000, 0, 1}, {"b", 1000, 2, 3}, {"c", 500, 1, 2}, {"d", 3000, 4, 4}};
  const MemoryPlan plan = plan_memory(buffers, 256);
  for (std::size_t i = 0; i < buffers.size(); ++i)
    for (std::size_t j = i + 1; j < buffers.size(); ++j) {
      const bool live_together = buffers[i].first <= buffers[j].last && buffers[j].first <= buffers[i].last;
      const auto& x = plan.slots[i];
      const auto& y = plan.slots[j];
      const bool bytes_overlap = x.offset < y.offset + y.bytes && y.offset < x.offset + x.bytes;
      CHECK_FALSE((live_together && bytes_overlap));
    }
  CHECK(plan.unshared_bytes == 1024 + 1024 + 512 + 3072);
  CHECK(plan.arena_bytes == 3072);  // d alone is the peak; a, b, c fit under it
  for (const auto& slot : plan.slots) CHECK(slot.offset % 256 == 0);
}

TEST_CASE("the reference step's arena is smaller than the sum of its buffers") {
  const Graph g = reference_fused();
  const Schedule s = build_schedule(g);
  const auto req = arena_request(g, s, sizes_of(g), std::vector<std::size_t>(s.aux.size(), 4096));
  const MemoryPlan plan = plan_memory(req.buffers);
  CHECK(plan.arena_bytes < plan.unshared_bytes);
  // The loss is a graph output: it stays live to the last launch.
  const int loss_buffer = req.buffer_of_value[static_cast<std::size_t>(g.value_named("loss"))];
  REQUIRE(loss_buffer >= 0);
  CHECK(req.buffers[static_cast<std::size_t>(loss_buffer)].last == static_cast<int>(s.launches.size()) - 1);
  CHECK(dump_memory_plan(plan).find("saved by reuse") != std::string::npos);
}

TEST_CASE("a backend may merge each dgrad with its weight's update into one launch") {
  const Graph g = reference_fused();
  ScheduleOptions options;
  int asked = 0;
  options.merge_dgrad_wgrad = [&](const Graph& graph, NodeId dgrad, NodeId wgrad) {
    ++asked;
    CHECK(graph.node(dgrad).inputs[0] == graph.node(wgrad).inputs[0]);  // the same output gradient
    return graph.value(graph.node(dgrad).inputs[1]).shape[0] == 128;      // only w2 and w3 ([128,128])
  };
  const Schedule s = build_schedule(g, options);
  CHECK(asked == 3);  // the dgrads of w2, w3, w4
  int merged = 0;
  for (const Launch& l : s.launches)
    if (l.kind == LaunchKind::dgrad_wgrad_sgd) {
      ++merged;
      CHECK(l.mask_from_relu_output);
      CHECK(l.updates.size() == 1);
      CHECK(g.value(l.updates[0]).role == Role::param);
      CHECK(l.writes.size() == 1);  // the previous layer's gradient
    }
  CHECK(merged == 2);
  CHECK(s.launches.size() == 16);
  // No cuBLASLt ReLU mask is left: w4's dgrad (10 terms) and the merged ones
  // mask by the ReLU outputs they read.
  CHECK(s.aux.empty());
  for (const Launch& l : s.launches) CHECK(l.epilogue != MatmulEpilogue::relu_aux_bias);
  CHECK_NOTHROW(check_schedule_order(g, s));
  CHECK(dump_schedule(g, s).find("dgrad_wgrad_sgd[mask=relu output") != std::string::npos);
}

namespace {

// The CUDA backend's batch-32 choices on the reference network: w2 and w3
// (128 x 128) merge dgrad and update, with the bias updates that follow, and
// the step advance rides on a bias update.
ScheduleOptions one_pass_options() {
  ScheduleOptions options;
  options.merge_dgrad_wgrad = [](const Graph& graph, NodeId dgrad, NodeId) {
    return graph.value(graph.node(dgrad).inputs[1]).shape[0] == 128;  // w2, w3
  };
  options.merge_bias_into_dgrad_wgrad = true;
  options.fold_step_advance = true;
  return options;
}

}  // namespace

TEST_CASE("merged launches may also take the following bias update, and a bias update the step advance") {
  const Graph g = reference_fused();
  const ScheduleOptions options = one_pass_options();
  const Schedule s = build_schedule(g, options);
  CHECK(s.launches.size() == 13);  // 18 - 2 merged pairs - 2 bias updates - the advance
  int with_bias = 0, with_advance = 0;
  for (const Launch& l : s.launches) {
    if (l.kind == LaunchKind::dgrad_wgrad_sgd && l.bias_sgd_node >= 0) {
      ++with_bias;
      CHECK(g.node(g.value(g.node(l.bias_sgd_node).inputs[1]).producer).op == OpKind::reduce_rows);
    }
    if (l.advance_node >= 0) {
      ++with_advance;
      CHECK(l.kind == LaunchKind::bias_grad_sgd);
      CHECK(std::find(l.updates.begin(), l.updates.end(), g.value_named("step")) != l.updates.end());
    }
    CHECK(!(l.kind == LaunchKind::single && g.node(l.nodes[0]).op == OpKind::advance_step));
  }
  CHECK(with_bias == 2);
  CHECK(with_advance == 1);
  CHECK_NOTHROW(check_schedule_order(g, s));
  const std::string dump = dump_schedule(g, s);
  CHECK(dump.find("+bias update") != std::string::npos);
  CHECK(dump.find("[+advance_step]") != std::string::npos);
}

TEST_CASE("a backend may run softmax-xent and the output layer's backward as one launch") {
  const Graph g = reference_fused();
  ScheduleOptions options = one_pass_options();
  const std::size_t without = build_schedule(g, options).launches.size();
  int asked = 0;
  bool allow = false;
  options.merge_output_layer_backward = [&](const Graph& graph, NodeId xent_backward, NodeId dgrad) {
    ++asked;
    CHECK(graph.node(xent_backward).op == OpKind::softmax_xent_backward);
    CHECK(graph.node(dgrad).inputs[0] == graph.node(xent_backward).outputs[0]);  // dlogits
    return allow;
  };
  CHECK(build_schedule(g, options).launches.size() == without);  // the backend declined
  CHECK(asked == 1);
  allow = true;
  const Schedule s = build_schedule(g, options);
  CHECK(s.launches.size() == without - 4);  // xent + 4 launches -> 1: 9 launches per step
  const auto fused = std::find_if(s.launches.begin(), s.launches.end(),
                                  [](const Launch& l) { return l.kind == LaunchKind::output_layer_backward; });
  REQUIRE(fused != s.launches.end());
  CHECK(g.node(fused->nodes[0]).op == OpKind::softmax_xent);
  CHECK(fused->advance_node >= 0);
  CHECK(g.value(g.node(fused->sgd_node).inputs[0]).shape == std::vector<std::int64_t>{10, 128});  // w4
  CHECK(g.value(g.node(fused->output_bias_sgd_node).inputs[0]).shape == std::vector<std::int64_t>{10});
  CHECK(g.value(g.node(fused->bias_sgd_node).inputs[0]).shape == std::vector<std::int64_t>{128});
  CHECK(fused->updates.size() == 4);  // w4, b4, b3, step
  CHECK(std::find(fused->writes.begin(), fused->writes.end(), g.value_named("loss")) != fused->writes.end());
  CHECK(std::find(fused->writes.begin(), fused->writes.end(), fused->output) != fused->writes.end());
  for (const Launch& l : s.launches) CHECK(l.kind != LaunchKind::xent);
  CHECK_NOTHROW(check_schedule_order(g, s));
  CHECK(dump_schedule(g, s).find("output_layer_backward[mask=relu output,+bias updates][+advance_step]") !=
        std::string::npos);
}

TEST_CASE("a backend may fold the batch fetch into the first forward and the first layer's update into a one-pass launch") {
  const Graph g = reference_fused();
  ScheduleOptions options = one_pass_options();
  options.merge_output_layer_backward = [](const Graph&, NodeId, NodeId) { return true; };
  const std::size_t without = build_schedule(g, options).launches.size();  // 9
  int fetch_asked = 0, update_asked = 0;
  bool allow = false;
  options.fold_fetch_into_forward = [&](const Graph& graph, NodeId matmul) {
    ++fetch_asked;
    CHECK(graph.node(graph.value(graph.node(matmul).inputs[0]).producer).op == OpKind::gather_rows);
    return allow;
  };
  options.merge_input_update = [&](const Graph& graph, NodeId dgrad, NodeId input_wgrad) {
    ++update_asked;
    // the wgrad reads the dgrad launch's dX (through its relu_backward) and the network input
    CHECK(graph.node(input_wgrad).inputs[1] == graph.value_named("x"));
    CHECK(graph.value(graph.node(dgrad).inputs[1]).shape == std::vector<std::int64_t>{128, 128});  // w2
    return allow;
  };
  CHECK(build_schedule(g, options).launches.size() == without);  // the backend declined both
  CHECK(fetch_asked == 1);
  CHECK(update_asked == 1);
  allow = true;
  const Schedule s = build_schedule(g, options);
  REQUIRE(s.launches.size() == without - 2);  // 7 launches per step
  const Launch& first = s.launches.front();
  CHECK(first.kind == LaunchKind::matmul);
  CHECK(first.fetches_batch);
  CHECK(g.node(first.nodes[0]).op == OpKind::batch_indices);
  CHECK(g.value(g.node(first.matmul_node).inputs[1]).shape == std::vector<std::int64_t>{128, 784});  // w1
  for (const char* fetched : {"x", "y"})  // read later: the launch writes them out
    CHECK(std::find(first.writes.begin(), first.writes.end(), g.value_named(fetched)) != first.writes.end());
  const Launch& last = s.launches.back();
  CHECK(last.kind == LaunchKind::dgrad_wgrad_sgd);
  REQUIRE(last.input_sgd_node >= 0);
  CHECK(g.node(last.input_sgd_node).inputs[0] == g.value_named("w1"));
  CHECK(g.node(last.input_wgrad_node).op == OpKind::matmul);
  CHECK(std::find(last.updates.begin(), last.updates.end(), g.value_named("w1")) != last.updates.end());
  CHECK(std::find(last.reads.begin(), last.reads.end(), g.value_named("x")) != last.reads.end());
  for (const Launch& l : s.launches) CHECK(l.kind != LaunchKind::batch_fetch);
  CHECK_NOTHROW(check_schedule_order(g, s));
  const std::string dump = dump_schedule(g, s);
  CHECK(dump.find("+batch fetch") != std::string::npos);
  CHECK(dump.find("+first layer's weight update") != std::string::npos);
}
