// Covering the fused training graph with the CUDA lowerings (no GPU needed:
// lowerings that ask the device are left out), and the memory plan.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>

#include "runtime/cuda/fast_paths/whole_step/whole_step_support.hpp"
#include "tests/runtime/schedule_test_support.hpp"

using namespace sg;
using namespace sg::schedule_test;

TEST_CASE("the reference training step lowers to 17 two-pass launches") {
  const Graph g = reference_fused();
  const auto lowered = lower(g, two_pass());
  const Schedule& s = lowered.schedule;
  auto counts = launch_counts(g, s);
  CHECK(counts["batch_fetch"] == 1);
  // The last hidden layer's mask is not kept: its dgrad (10 terms, the
  // classifier's) masks by the relu output it reads instead.
  CHECK(counts["cublaslt_matmul[epilogue=relu_aux_bias]"] == 2);
  CHECK(counts["cublaslt_matmul[epilogue=relu_bias]"] == 1);
  CHECK(counts["small_n_forward[epilogue=bias]"] == 1);  // the classifier's forward
  CHECK(counts["softmax_xent"] == 1);
  CHECK(counts["cublaslt_matmul[epilogue=drelu]"] == 2);
  CHECK(counts["small_k_dgrad_relu[mask=relu output]"] == 1);
  CHECK(counts[std::string("cublaslt_matmul[epilogue=none,") + kIntoParam + "]"] == 3);
  CHECK(counts[std::string("small_m_wgrad_sgd[") + kIntoParam + "]"] == 1);
  CHECK(counts["bias_grad_sgd"] == 4);
  CHECK(counts["advance_step"] == 0);  // it rides on the last bias update
  CHECK(s.launches.size() == 17);
  CHECK(s.aux.size() == 2);
  int value_masked = 0;
  for (const auto& l : s.launches)
    if (name_of(l) == "small_k_dgrad_relu") {
      ++value_masked;
      CHECK(l.aux_read == -1);
      CHECK(reads(l, g.value_named("relu_2")));
    }
  CHECK(value_masked == 1);
  // Weight gradients never get a buffer: nothing writes grad_w*.
  for (const auto& l : s.launches)
    for (ValueId w : l.writes) CHECK(g.value(w).name.rfind("grad_w", 0) != 0);
  // A cuBLASLt dgrad reads its mask, not the relu output the mask replaces.
  for (const auto& l : s.launches)
    if (l.aux_read >= 0) CHECK_FALSE(reads(l, g.value_named(l.aux_read == 0 ? "relu" : "relu_1")));
  const std::string dump = dump_schedule(g, s);
  CHECK(dump.find(kIntoParam) != std::string::npos);
  CHECK(dump.find("bias_grad_sgd[+advance_step]") != std::string::npos);
}

TEST_CASE("the dgrad matmul reading a weight runs before that weight's fused update") {
  const Graph g = reference_fused();
  const auto lowered = lower(g, two_pass());
  const Schedule& s = lowered.schedule;
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
  const auto lowered = lower(g, two_pass());
  int into_velocity = 0;
  for (const auto& l : lowered.schedule.launches)
    into_velocity += l.lowering->describe(g, l).find("into=velocity(alpha=1,beta=momentum)") != std::string::npos;
  CHECK(into_velocity == 4);  // the small-M kernel does plain SGD only: cuBLASLt takes the classifier's too
}

TEST_CASE("an unfused graph lowers to one launch per node (but batch fetch and the updates share one each)") {
  MlpSpec spec;
  spec.layers = {784, 64, 10};
  FusionOptions only_fetch{false, false, false, true};
  const Graph g = build_training_stages(spec, {0.1, 0.0, 0.0}, only_fetch).fused;
  const auto lowered = lower(g, two_pass());
  // 3 fetch nodes -> 1 launch; the 4 SGD updates and the step advance -> the one multi-tensor update.
  const auto updates = std::count_if(g.nodes().begin(), g.nodes().end(),
                                     [](const Node& n) { return n.op == OpKind::sgd_update; });
  CHECK(updates == 4);
  CHECK(lowered.schedule.launches.size() == g.nodes().size() - 2 - std::size_t(updates));
  CHECK(lowered.schedule.aux.empty());
  FusionOptions nothing{false, false, false, false};
  const Graph bare = build_training_stages(spec, {0.1, 0.0, 0.0}, nothing).fused;
  CHECK_THROWS_WITH_AS(lower(bare, two_pass()), doctest::Contains("batch_indices"), GraphError);
}

// build_schedule runs check_schedule_order on every schedule it returns, so the
// other tests do not repeat it: this one shows that the check can fail.
TEST_CASE("check_schedule_order catches a reordered schedule") {
  const Graph g = reference_fused();
  auto lowered = lower(g, two_pass());
  Schedule& s = lowered.schedule;
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
  const auto lowered = lower(g, two_pass());
  const Schedule& s = lowered.schedule;
  const auto req = arena_request(g, s, sizes_of(g), std::vector<std::size_t>(s.aux.size(), 4096));
  const MemoryPlan plan = plan_memory(req.buffers);
  CHECK(plan.arena_bytes < plan.unshared_bytes);
  // The loss is a graph output: it stays live to the last launch.
  const int loss_buffer = req.buffer_of_value[static_cast<std::size_t>(g.value_named("loss"))];
  REQUIRE(loss_buffer >= 0);
  CHECK(req.buffers[static_cast<std::size_t>(loss_buffer)].last == static_cast<int>(s.launches.size()) - 1);
  CHECK(dump_memory_plan(plan).find("saved by reuse") != std::string::npos);
}

TEST_CASE("the one-pass lowering merges each fitting dgrad with its weight's update and bias update") {
  const Graph g = reference_fused();
  BackendOptions o = without_forwards();
  const auto lowered = lower(g, o);
  const Schedule& s = lowered.schedule;
  int merged = 0, with_bias = 0;
  for (const Launch& l : s.launches)
    if (name_of(l) == "one_pass_strips") {
      ++merged;
      // w2 and w3 ([128,128]); w4 (10 rows) is not a multiple of 16
      CHECK(l.updates.size() == 2);  // the weight and the previous layer's bias
      for (ValueId u : l.updates) CHECK(g.value(u).role == Role::param);
      CHECK(l.writes.size() == 1);   // the previous layer's gradient
      CHECK(l.aux_read == -1);
      const std::string note = l.lowering->describe(g, l);
      CHECK(note.find("mask=relu output") != std::string::npos);
      with_bias += note.find("+bias update") != std::string::npos;
    }
  CHECK(merged == 2);
  CHECK(with_bias == 2);
  // No cuBLASLt ReLU mask is left: w4's dgrad (10 terms) and the merged ones
  // mask by the ReLU outputs they read.
  CHECK(s.aux.empty());
  for (const Launch& l : s.launches) CHECK(l.lowering->describe(g, l).find("relu_aux_bias") == std::string::npos);
}

TEST_CASE("the output-layer lowering runs softmax-xent and the output layer's backward as one launch") {
  const Graph g = reference_fused();
  BackendOptions o = without_forwards();
  const auto lowered = lower(g, o);
  const Schedule& s = lowered.schedule;
  CHECK(s.launches.size() == 9);  // 4 forwards, the output layer, 2 one-pass launches, 2 first-layer updates
  const auto fused = std::find_if(s.launches.begin(), s.launches.end(),
                                  [](const Launch& l) { return name_of(l) == "output_layer_backward"; });
  REQUIRE(fused != s.launches.end());
  CHECK(g.node(fused->nodes[0]).op == OpKind::softmax_xent);
  CHECK(fused->riders.size() == 1);  // the step advance
  for (const char* p : {"w4", "b4", "b3", "step"}) CHECK(updates(*fused, g.value_named(p)));
  CHECK(fused->updates.size() == 4);
  CHECK(writes(*fused, g.value_named("loss")));
  CHECK(writes(*fused, g.value_named("grad_bias_add_2")));  // dX of the last hidden layer, masked
  for (const Launch& l : s.launches) CHECK(name_of(l) != "softmax_xent");
  CHECK(dump_schedule(g, s).find("output_layer_backward[mask=relu output,+bias updates][+advance_step]") !=
        std::string::npos);
  // Turned off, the five launches come back.
  o.one_pass_backward = false;
  CHECK(lower(g, o).schedule.launches.size() == 17);
}

TEST_CASE("the batch fetch folds into the first forward and the first layer's update into a one-pass launch") {
  const Graph g = reference_fused();
  BackendOptions o = without_forwards();
  const std::size_t without = lower(g, o).schedule.launches.size();  // 9
  o.small_batch_forward = true;
  o.fold_input_update = true;
  const auto lowered = lower(g, o);
  const Schedule& s = lowered.schedule;
  REQUIRE(s.launches.size() == without - 2);  // 7 launches per step
  const Launch& first = s.launches.front();
  CHECK(name_of(first) == "small_batch_forward");
  CHECK(g.node(first.nodes[0]).op == OpKind::batch_indices);
  for (const char* fetched : {"x", "y"})  // read later: the launch writes them out
    CHECK(writes(first, g.value_named(fetched)));
  CHECK(updates(s.launches.back(), g.value_named("w1")));
  const Launch& last = s.launches.back();
  CHECK(name_of(last) == "one_pass_strips");
  CHECK(reads(last, g.value_named("x")));
  for (const Launch& l : s.launches) CHECK(name_of(l) != "batch_fetch");
  const std::string dump = dump_schedule(g, s);
  CHECK(dump.find("+batch fetch") != std::string::npos);
  CHECK(dump.find("+first layer's weight update") != std::string::npos);
  // The hidden forwards are ours too: no cuBLASLt launch is left.
  for (const Launch& l : s.launches) CHECK(name_of(l) != "cublaslt_matmul");
}

TEST_CASE("fp32 master weights: every parameter's cast in one cast_params launch, the fused updates into fp32") {
  const Graph g = reference_fused(0.0, DType::f32);
  const auto lowered = lower(g, BackendOptions{});
  const Schedule& s = lowered.schedule;
  int cast_launches = 0;
  for (const Launch& l : s.launches) {
    if (name_of(l) == "elementwise") CHECK(g.node(l.nodes[0]).op != OpKind::cast);
    if (name_of(l) != "cast_params") continue;
    ++cast_launches;
    CHECK(l.nodes.size() == 8);  // each parameter cast to fp16 for the matmuls
    for (NodeId n : l.nodes) CHECK(g.node(n).op == OpKind::cast);
  }
  CHECK(cast_launches == 1);
  for (const Launch& l : s.launches) CHECK(name_of(l).rfind("one_pass", 0) != 0);  // fp16 weights only
}

TEST_CASE("a new element-wise op is covered by the element-wise lowering, with no scheduler edit") {
  Graph g;
  const ValueId x = g.input("x", {8, 24}, DType::f16);
  const ValueId dy = g.input("dy", {8, 24}, DType::f16);
  g.mark_output(g.gelu(x));
  g.mark_output(g.gelu_backward(dy, x));
  const auto lowered = lower(g, BackendOptions{});
  REQUIRE(lowered.schedule.launches.size() == 2);
  for (const Launch& l : lowered.schedule.launches) CHECK(name_of(l) == "elementwise");
  // An op with no CUDA kernel (yet) is refused by name, before anything runs.
  Graph two_outputs;
  const ValueId z = two_outputs.input("z", {8, 24}, DType::f16);
  const ValueId b = two_outputs.param("b", {24}, DType::f16);
  for (ValueId out : two_outputs.bias_add_relu(z, b)) two_outputs.mark_output(out);
  CHECK_THROWS_WITH_AS(lower(two_outputs, BackendOptions{}), doctest::Contains("no lowering takes bias_add_relu"),
                       GraphError);
}

TEST_CASE("a launch is placed where its first unit runs only if what it reads exists by then") {
  // fp32 master weights at batch 32: the fp16 casts of w1 and b1 come after
  // the batch fetch, so the fetch cannot fold into the first forward.
  MlpSpec spec;
  spec.layers = {48, 32, 10};
  spec.dataset_rows = 400;
  spec.weight_dtype = DType::f32;
  const Graph g = build_training_stages(spec, {0.1, 0.0, 0.0}).fused;
  BackendOptions o;
  o.whole_step = false;
  const auto lowered = lower(g, o);
  CHECK(name_of(lowered.schedule.launches.front()) == "batch_fetch");
  int ours = 0;
  for (const Launch& l : lowered.schedule.launches) ours += name_of(l) == "small_batch_forward";
  CHECK(ours == 1);  // the first forward is still ours, without the fetch
}

TEST_CASE("bf16 graphs take only the generic lowerings: the fp16-only fast ones refuse them") {
  // Each fast lowering's match checks fp16 (kernels written for __half); a
  // bf16 step must fall through to cuBLASLt and the dtype-generic kernels.
  const std::vector<std::string> generic = {"batch_fetch", "cublaslt_matmul", "softmax_xent", "bias_grad_sgd",
                                            "cast_params", "elementwise"};
  for (const DType weights : {DType::bf16, DType::f32})
    for (const double momentum : {0.0, 0.9})
      for (const std::int64_t batch : {32, 128}) {
        MlpSpec spec;
        spec.layers = {784, 128, 128, 128, 10};
        spec.batch = batch;
        spec.weight_dtype = weights;
        spec.compute_dtype = DType::bf16;
        const Graph g = build_training_stages(spec, {0.003, momentum, 0.0}).fused;
        CAPTURE(dtype_name(weights));
        CAPTURE(momentum);
        CAPTURE(batch);
        const auto lowered = lower(g, BackendOptions{});
        for (const Launch& l : lowered.schedule.launches) {
          CAPTURE(name_of(l));
          CHECK(std::find(generic.begin(), generic.end(), name_of(l)) != generic.end());
        }
        // The whole-step kernels (left out above: they ask the device) refuse it too:
        // bf16 weights by dtype, fp32 master weights (casts) by the step's shape.
        for (const bool resident : {false, true}) {
          const std::string why = cuda::whole_step_blocker(g, BackendOptions{}, resident);
          if (weights == DType::bf16) CHECK(why == "parameters or activations are not fp16");
          else CHECK_FALSE(why.empty());
        }
        // The same network in fp16 does take fast lowerings (so the check above can fail).
        spec.compute_dtype = DType::f16;
        spec.weight_dtype = weights == DType::bf16 ? DType::f16 : DType::f32;
        const Graph fp16 = build_training_stages(spec, {0.003, momentum, 0.0}).fused;
        const auto fast = lower(fp16, BackendOptions{});
        CHECK(std::any_of(fast.schedule.launches.begin(), fast.schedule.launches.end(), [&](const Launch& l) {
          return std::find(generic.begin(), generic.end(), name_of(l)) == generic.end();
        }));
      }
}
