// Covering the fused training graph with the CUDA lowerings (no GPU needed:
// lowerings that ask the device are left out), and the memory plan.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>

#include "models/mlp.hpp"
#include "models/sequential.hpp"
#include "runtime/cuda/lowering.hpp"
#include "runtime/cuda/lowerings/whole_step_support.hpp"
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

// Our fused kernels but not the small-batch forwards and the first layer's folded update.
BackendOptions without_forwards() {
  BackendOptions o;
  o.whole_step = false;
  o.small_batch_forward = false;
  o.fold_input_update = false;
  return o;
}

// The two-pass schedule: cuBLASLt and the plain kernels, none of our fused ones.
BackendOptions two_pass() {
  BackendOptions o;
  o.one_pass_backward = false;
  o.whole_step = false;
  return o;
}

// A schedule together with the lowerings its launches point to.
struct Lowered {
  std::vector<std::unique_ptr<cuda::CudaLowering>> lowerings;
  Schedule schedule;
};

Lowered lower(const Graph& g, const BackendOptions& options) {
  Lowered l;
  l.lowerings = cuda::cuda_lowerings(options, /*device_present=*/false);
  l.schedule = build_schedule(g, cuda::as_lowerings(l.lowerings));
  return l;
}

std::string name_of(const Launch& l) { return std::string(l.lowering->name()); }

// "lowering[note]" of every launch, counted.
std::map<std::string, int> launch_counts(const Graph& g, const Schedule& s) {
  std::map<std::string, int> counts;
  for (const auto& l : s.launches) {
    std::string key = name_of(l);
    if (const std::string note = l.lowering->describe(g, l); !note.empty()) key += "[" + note + "]";
    if (key == "elementwise") key = std::string(op_name(g.node(l.nodes[0]).op));
    ++counts[key];
  }
  return counts;
}

bool reads(const Launch& l, ValueId v) { return std::find(l.reads.begin(), l.reads.end(), v) != l.reads.end(); }
bool writes(const Launch& l, ValueId v) { return std::find(l.writes.begin(), l.writes.end(), v) != l.writes.end(); }
bool updates(const Launch& l, ValueId v) { return std::find(l.updates.begin(), l.updates.end(), v) != l.updates.end(); }

std::vector<std::size_t> sizes_of(const Graph& g) {
  std::vector<std::size_t> bytes;
  for (const auto& v : g.values()) bytes.push_back(static_cast<std::size_t>(element_count(v.shape)) * dtype_size(v.dtype));
  return bytes;
}

constexpr const char* kIntoParam = "into=param(alpha=-lr,beta=1-lr*wd)";

}  // namespace

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

TEST_CASE("an unfused graph lowers to one launch per node (but batch fetch stays fused)") {
  MlpSpec spec;
  spec.layers = {784, 64, 10};
  FusionOptions only_fetch{false, false, false, true};
  const Graph g = build_training_stages(spec, {0.1, 0.0, 0.0}, only_fetch).fused;
  const auto lowered = lower(g, two_pass());
  // 3 fetch nodes -> 1 launch, and the advance rides on nothing: no fused bias update to take it.
  CHECK(lowered.schedule.launches.size() == g.nodes().size() - 2);
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

namespace {

// Issue 21's model variants on the reference network (fp16, plain SGD).
struct Variant {
  std::string what;
  MlpSpec spec;
};

std::vector<Variant> issue21_variants(std::int64_t batch) {
  MlpSpec base;
  base.layers = {784, 128, 128, 128, 10};
  base.batch = batch;
  std::vector<Variant> out;
  for (const auto a : {MlpActivation::gelu, MlpActivation::gelu_tanh, MlpActivation::silu, MlpActivation::tanh,
                       MlpActivation::sigmoid, MlpActivation::identity}) {
    MlpSpec s = base;
    s.activation = a;
    out.push_back({"activation " + std::string(activation_name(a)), s});
  }
  MlpSpec dropout = base;
  dropout.dropout = 0.2;
  out.push_back({"relu + dropout", dropout});
  MlpSpec smoothed = base;
  smoothed.label_smoothing = 0.1;
  out.push_back({"label smoothing", smoothed});
  for (const auto loss : {MlpLoss::mse, MlpLoss::l1}) {
    MlpSpec s = base;
    s.loss = loss;
    s.target_width = 10;
    out.push_back({"loss " + std::string(loss_name(loss)), s});
  }
  MlpSpec all = base;
  all.activation = MlpActivation::gelu_tanh;
  all.dropout = 0.1;
  all.loss = MlpLoss::mse;
  all.target_width = 10;
  out.push_back({"gelu_tanh + dropout + mse", all});
  return out;
}

}  // namespace

TEST_CASE("dropout, label smoothing, mse/l1 and identity graphs refuse the kernels fused for their absent pattern") {
  // The whole-step kernels (written for softmax-xent + plain SGD) must
  // refuse every one of these graphs but the activation variants, the fused output layer every graph
  // without softmax-xent or with no activation backward right after the
  // classifier's dgrad; the kernels that fuse an activation's derivative into
  // a dgrad (one-pass dgrad+SGD, the small-K dgrad) must refuse every graph
  // whose dgrad is not followed directly by an activation backward (dropout
  // between them; identity). Graphs with gelu, gelu_tanh, silu, tanh or
  // sigmoid take them (the next test case); the plain-linear kernels
  // (small_batch_forward, small_n_forward, small_m_wgrad_sgd) compute what
  // the graph says and may take any graph's layers.
  const std::vector<std::string> whole_step = {"whole_step", "resident_step"};
  const std::vector<std::string> loss_specific = {"output_layer_backward", "whole_step", "resident_step"};
  const std::vector<std::string> relu_specific = {"one_pass_wgmma", "one_pass_row_ranges", "one_pass_strips",
                                                  "small_k_dgrad_relu"};
  for (const std::int64_t batch : {32, 128}) {
    for (const Variant& v : issue21_variants(batch)) {
      CAPTURE(v.what);
      CAPTURE(batch);
      const Graph g = build_training_stages(v.spec, {0.003, 0.0, 0.0}).fused;
      const auto lowered = lower(g, BackendOptions{});
      // A dgrad followed directly by an activation's backward (none with identity, dropout between).
      const bool activation_dgrad = v.spec.activation != MlpActivation::identity && v.spec.dropout == 0.0;
      const bool plain_xent = v.spec.loss == MlpLoss::softmax_xent && v.spec.label_smoothing == 0.0;
      std::vector<std::string> refused = activation_dgrad && plain_xent ? whole_step : loss_specific;
      if (!activation_dgrad) refused.insert(refused.end(), relu_specific.begin(), relu_specific.end());
      std::map<std::string, int> by_lowering;
      for (const Launch& l : lowered.schedule.launches) {
        CAPTURE(name_of(l));
        CHECK(std::find(refused.begin(), refused.end(), name_of(l)) == refused.end());
        ++by_lowering[name_of(l)];
        // No launch that fuses a ReLU takes a non-ReLU network's layer.
        if (v.spec.activation != MlpActivation::relu) {
          const std::string note = l.lowering->describe(g, l);
          CHECK(note.find("relu") == std::string::npos);
        }
      }
      if (v.spec.dropout > 0) CHECK(by_lowering["dropout"] == 2 * 3);  // forward + backward per hidden layer
      if (v.spec.label_smoothing > 0) CHECK(by_lowering["softmax_xent_smoothed"] == 2);
      if (is_regression(v.spec.loss)) CHECK(by_lowering["regression_loss"] == 2);
      // The whole-step kernels (left out above: they ask the device) take every activation's plain
      // softmax-xent step (test_whole_step_match.cpp) and refuse the others by structure.
      if (activation_dgrad && plain_xent)
        CHECK(match_whole_step(g).has_value());
      else
        for (const bool resident : {false, true})
          CHECK(cuda::whole_step_blocker(g, BackendOptions{}, resident) == "the graph is not a plain MLP training step");
      // The eval graph (no dropout; loss only for regression) is covered too.
      MlpSpec eval_spec = v.spec;
      eval_spec.batch = 100;
      Graph eval = build_mlp_eval(eval_spec);
      fuse(eval);
      for (const auto& n : eval.nodes()) CHECK(n.op != OpKind::dropout);
    }
  }
  // The same network with ReLU and softmax-xent is a whole-step match, and at
  // batch 32 takes both kinds of fast lowerings (so the checks above can fail).
  for (const std::int64_t batch : {32, 128}) {
    MlpSpec spec;
    spec.layers = {784, 128, 128, 128, 10};
    spec.batch = batch;
    const Graph g = build_training_stages(spec, {0.003, 0.0, 0.0}).fused;
    const auto lowered = lower(g, BackendOptions{});
    for (const auto* kind : {&loss_specific, &relu_specific})
      if (batch == 32) CHECK(std::any_of(lowered.schedule.launches.begin(), lowered.schedule.launches.end(), [&](const Launch& l) {
        return std::find(kind->begin(), kind->end(), name_of(l)) != kind->end();
      }));
    CHECK(match_whole_step(g).has_value());
  }
}

TEST_CASE("gelu_tanh fuses into cuBLASLt's GELU_AUX_BIAS forward and DGELU dgrad (GELU_BIAS in the eval graph)") {
  // (At batch 16/32 our kernels take these layers: the next test case.)
  for (const std::int64_t batch : {128, 256}) {
    CAPTURE(batch);
    MlpSpec spec;
    spec.layers = {784, 128, 128, 128, 10};
    spec.batch = batch;
    spec.activation = MlpActivation::gelu_tanh;
    const Graph g = build_training_stages(spec, {0.003, 0.0, 0.0}).fused;
    const auto lowered = lower(g, BackendOptions{});
    const auto counts = launch_counts(g, lowered.schedule);
    CHECK(counts.count("cublaslt_matmul[epilogue=gelu_aux_bias]") == 1);
    CHECK(counts.at("cublaslt_matmul[epilogue=gelu_aux_bias]") == 3);  // every hidden layer's forward
    CHECK(counts.at("cublaslt_matmul[epilogue=dgelu]") == 2);          // every dgrad between hidden layers
    // (the classifier's, over 10 terms, is our small-K kernel's at any batch, as with ReLU)
    CHECK(counts.at("small_k_dgrad_relu[gelu_tanh_backward reading the pre-activation]") == 1);
    CHECK(counts.count("gelu_tanh") == 0);                             // no element-wise GELU left
    CHECK(counts.count("gelu_tanh_backward") == 0);
    MlpSpec eval_spec = spec;
    eval_spec.batch = 100;
    Graph eval = build_mlp_eval(eval_spec);
    fuse(eval);
    const auto eval_counts = launch_counts(eval, lower(eval, BackendOptions{}).schedule);
    CHECK(eval_counts.at("cublaslt_matmul[epilogue=gelu_bias]") == 3);  // nothing reads the pre-activation
  }
  // A width that is not a multiple of 8 cannot be cuBLASLt's aux: the same
  // launch runs the bias epilogue and then the gelu map kernels.
  // (Two hidden layers: the classifier's dgrad, over 10 terms, is our small-K kernel's.)
  MlpSpec odd;
  odd.layers = {784, 100, 100, 10};
  odd.batch = 128;
  odd.activation = MlpActivation::gelu_tanh;
  const Graph g = build_training_stages(odd, {0.003, 0.0, 0.0}).fused;
  const auto lowered = lower(g, BackendOptions{});
  const auto counts = launch_counts(g, lowered.schedule);
  CHECK(counts.at("cublaslt_matmul[epilogue=bias+gelu_tanh kernel]") == 2);
  CHECK(counts.at("cublaslt_matmul[epilogue=none+gelu_tanh_backward kernel]") == 1);
  // Exact GELU (erf) is not cuBLASLt's: it stays element-wise.
  MlpSpec exact = odd;
  exact.layers = {784, 128, 128, 10};
  exact.activation = MlpActivation::gelu;
  const Graph ge = build_training_stages(exact, {0.003, 0.0, 0.0}).fused;
  const auto exact_counts = launch_counts(ge, lower(ge, BackendOptions{}).schedule);
  CHECK(exact_counts.at("gelu") == 2);
  CHECK(exact_counts.at("gelu_backward") == 1);
}

TEST_CASE("gelu, gelu_tanh, silu, tanh and sigmoid MLPs at batch 32 run in our small-batch kernels, as ReLU does") {
  for (const auto a : {MlpActivation::gelu, MlpActivation::gelu_tanh, MlpActivation::silu, MlpActivation::tanh,
                       MlpActivation::sigmoid}) {
    const std::string act(activation_name(a));
    CAPTURE(act);
    // gelu, gelu_tanh and silu backwards read the pre-activation, tanh and sigmoid the output.
    const bool reads_input = a == MlpActivation::gelu || a == MlpActivation::gelu_tanh || a == MlpActivation::silu;
    const std::string saved = reads_input ? "pre-activation" : "output";
    MlpSpec spec;
    spec.layers = {784, 128, 128, 128, 10};
    spec.batch = 32;
    spec.activation = a;
    {  // plain SGD: the 7 launches of the ReLU step
      const Graph g = build_training_stages(spec, {0.003, 0.0, 0.0}).fused;
      const auto lowered = lower(g, BackendOptions{});
      const Schedule& s = lowered.schedule;
      const auto counts = launch_counts(g, s);
      const std::string forward = "small_batch_forward[epilogue=bias+" + act + (reads_input ? ",writes pre-activation" : "");
      CHECK(counts.count(forward + ",+batch fetch]") == 1);
      CHECK(counts.count(forward + "]") == 1);
      if (counts.count(forward + "]")) CHECK(counts.at(forward + "]") == 2);
      CHECK(counts.count("output_layer_backward[" + act + "_backward reading the " + saved + ",+bias updates]") == 1);
      int one_pass = 0;
      for (const Launch& l : s.launches) {
        CAPTURE(name_of(l));
        CHECK(name_of(l) != "cublaslt_matmul");
        CHECK(name_of(l) != "elementwise");  // no activation or backward left on its own
        const std::string note = l.lowering->describe(g, l);
        if (name_of(l) == "one_pass_strips") {
          ++one_pass;
          CHECK(note.find(act + "_backward reading the " + saved + "," + kIntoParam + ",+bias update") == 0);
        }
        if (name_of(l) == "small_batch_forward") {
          // The pre-activation leaves the launch exactly when a backward reads it.
          const NodeId bias_add = *std::find_if(l.nodes.begin(), l.nodes.end(),
                                                [&](NodeId n) { return g.node(n).op == OpKind::bias_add; });
          CHECK(writes(l, g.node(bias_add).outputs[0]) == reads_input);
          CHECK(op_name(g.node(l.nodes.back()).op) == act);  // the activation node rides along
        }
      }
      CHECK(one_pass == 2);
      CHECK(s.launches.size() == 7);
      CHECK(s.aux.empty());
    }
    {  // momentum: no one-pass or fused output layer (plain SGD only); the classifier's dgrad is small_k_dgrad's
      const Graph g = build_training_stages(spec, {0.003, 0.9, 0.0}).fused;
      const auto lowered = lower(g, BackendOptions{});
      const auto counts = launch_counts(g, lowered.schedule);
      CHECK(counts.count("small_k_dgrad_relu[" + act + "_backward reading the " + saved + "]") == 1);
      // The two dgrads between hidden layers: cuBLASLt, then the map (gelu_tanh: cuBLASLt's DGELU).
      if (a == MlpActivation::gelu_tanh) CHECK(counts.at("cublaslt_matmul[epilogue=dgelu]") == 2);
      else CHECK(counts.at(act + "_backward") == 2);
      for (const Launch& l : lowered.schedule.launches) CHECK(name_of(l).rfind("one_pass", 0) != 0);
    }
    {  // batch 128: none of our small-batch kernels; the element-wise maps (or cuBLASLt's GELU) run the activation
      MlpSpec wide = spec;
      wide.batch = 128;
      const Graph g = build_training_stages(wide, {0.003, 0.0, 0.0}).fused;
      const auto lowered = lower(g, BackendOptions{});
      for (const Launch& l : lowered.schedule.launches)
        for (const char* ours : {"small_batch_forward", "one_pass_strips", "output_layer_backward"})
          CHECK(name_of(l) != ours);
      // (The classifier's dgrad, over 10 terms, is the small-K kernel's at any batch, as with ReLU.)
      CHECK(launch_counts(g, lowered.schedule).at("small_k_dgrad_relu[" + act + "_backward reading the " + saved + "]") == 1);
    }
    {  // K = 8192: the row-range one-pass kernel
      MlpSpec big = spec;
      big.layers = {784, 8192, 8192, 10};
      const Graph g = build_training_stages(big, {0.003, 0.0, 0.0}).fused;
      const auto lowered = lower(g, BackendOptions{});
      CHECK(launch_counts(g, lowered.schedule)
                .count("one_pass_row_ranges[" + act + "_backward reading the " + saved + "," + kIntoParam +
                       ",+bias update]") == 1);
    }
    {  // the eval graph at batch 32: nothing reads the pre-activation
      MlpSpec eval_spec = spec;
      Graph eval = build_mlp_eval(eval_spec);
      fuse(eval);
      const auto lowered = lower(eval, BackendOptions{});
      const auto counts = launch_counts(eval, lowered.schedule);
      int forwards = 0;
      for (const auto& [key, n] : counts)
        if (key.rfind("small_batch_forward[epilogue=bias+" + act, 0) == 0) {
          forwards += n;
          CHECK(key.find("writes pre-activation") == std::string::npos);
        }
      CHECK(forwards == 3);
    }
  }
}

// ---- Issue 22: the CNN's own kernels (pooling chains, dropout2d, channel sums, conv weight updates)

namespace {

// Takes whatever the CUDA lowerings leave (the convolutions and views, where
// this build has no lowering for them or it asks the device), so the test
// sees how the CNN's other nodes are covered.
class TakeTheRest final : public Lowering {
 public:
  std::string_view name() const override { return "rest"; }
  std::optional<Match> match(const Cover&, const CoverUnit& unit) const override {
    Match m;
    m.units = {unit.id};
    return m;
  }
};

// configs/mnist_cnn.yaml's network: conv 1->10 k5, pool 2, relu; conv 10->20
// k5, dropout2d, pool 2, relu; flatten, linear 320->50, relu, dropout, linear
// 50->10; fp32 master weights, f16 compute.
SequentialSpec mnist_cnn(DType compute = DType::f16) {
  SequentialSpec spec;
  spec.input_shape = {1, 28, 28};
  auto layer = [](LayerKind kind) { return LayerSpec{kind}; };
  LayerSpec conv1 = layer(LayerKind::conv2d), conv2 = layer(LayerKind::conv2d);
  conv1.out = 10;
  conv1.kernel = 5;
  conv2.out = 20;
  conv2.kernel = 5;
  LayerSpec pool = layer(LayerKind::max_pool2d);
  pool.kernel = 2;
  LayerSpec drop2d = layer(LayerKind::dropout2d), drop = layer(LayerKind::dropout);
  drop2d.p = 0.5;
  drop.p = 0.5;
  LayerSpec fc1 = layer(LayerKind::linear), fc2 = layer(LayerKind::linear);
  fc1.out = 50;
  fc2.out = 10;
  const LayerSpec relu = layer(LayerKind::activation);
  spec.layers = {conv1, pool, relu, conv2, drop2d, pool, relu, layer(LayerKind::flatten), fc1, relu, drop, fc2};
  spec.batch = 64;
  spec.weight_dtype = DType::f32;
  spec.compute_dtype = compute;
  return spec;
}

struct CnnLowered {
  std::vector<std::unique_ptr<cuda::CudaLowering>> lowerings;
  TakeTheRest rest;
  Schedule schedule;
};

std::unique_ptr<CnnLowered> lower_cnn(const Graph& g) {
  auto l = std::make_unique<CnnLowered>();
  l->lowerings = cuda::cuda_lowerings(BackendOptions{}, /*device_present=*/false);
  auto all = cuda::as_lowerings(l->lowerings);
  all.push_back(&l->rest);
  l->schedule = build_schedule(g, all);
  return l;
}

std::vector<NodeId> nodes_of(const Graph& g, OpKind op) {
  std::vector<NodeId> out;
  for (const Node& n : g.nodes())
    if (n.op == op) out.push_back(n.id);
  return out;
}

// The launch running `node`.
const Launch& launch_of(const Schedule& s, NodeId node) {
  for (const Launch& l : s.launches)
    if (std::find(l.nodes.begin(), l.nodes.end(), node) != l.nodes.end()) return l;
  FAIL("node " << node << " is in no launch");
  throw std::logic_error("unreachable");
}

std::vector<OpKind> ops_of(const Graph& g, const Launch& l) {
  std::vector<OpKind> ops;
  for (NodeId n : l.nodes) ops.push_back(g.node(n).op);
  std::sort(ops.begin(), ops.end());
  return ops;
}

std::vector<OpKind> sorted(std::vector<OpKind> ops) {
  std::sort(ops.begin(), ops.end());
  return ops;
}

ValueId output_of(const Graph& g, NodeId n) { return g.node(n).outputs[0]; }

}  // namespace

TEST_CASE("the CNN's pooling chains, channel sums and conv weight updates take issue 22's own lowerings") {
  for (const DType compute : {DType::f16, DType::bf16, DType::f32}) {
    CAPTURE(dtype_name(compute));
    const Graph g = build_sequential_training_stages(mnist_cnn(compute), {0.01, 0.5, 0.0}).fused;
    const auto lowered = lower_cnn(g);
    const Schedule& s = lowered->schedule;
    const auto pools = nodes_of(g, OpKind::max_pool2d);
    const auto relus = nodes_of(g, OpKind::relu);
    const auto dropout2d = nodes_of(g, OpKind::dropout2d);
    REQUIRE(pools.size() == 2);
    REQUIRE(dropout2d.size() == 1);

    // Forward: "max-pool, relu" and "dropout2d, max-pool, relu", one launch each.
    const Launch& first = launch_of(s, pools[0]);
    CHECK(name_of(first) == "max_pool2d");
    CHECK(ops_of(g, first) == sorted({OpKind::max_pool2d, OpKind::relu}));
    CHECK(first.lowering->describe(g, first) == "k=2,s=2+relu");
    CHECK_FALSE(writes(first, output_of(g, pools[0])));  // the pooled values live only in the kernel
    CHECK(writes(first, output_of(g, relus[0])));        // the next conv, its wgrad and relu_backward read it
    const Launch& second = launch_of(s, pools[1]);
    CHECK(name_of(second) == "max_pool2d");
    CHECK(ops_of(g, second) == sorted({OpKind::dropout2d, OpKind::max_pool2d, OpKind::relu}));
    CHECK(second.lowering->describe(g, second) == "dropout2d+k=2,s=2+relu");
    CHECK(writes(second, output_of(g, dropout2d[0])));  // max_pool2d_backward takes its argmax from it
    CHECK_FALSE(writes(second, output_of(g, pools[1])));

    // Backward: relu_backward -> max_pool2d_backward [-> dropout2d_backward], one launch each.
    const auto pool_grads = nodes_of(g, OpKind::max_pool2d_backward);
    REQUIRE(pool_grads.size() == 2);
    const Launch& deep = launch_of(s, pool_grads[0]);  // the second pooling's backward comes first
    CHECK(name_of(deep) == "max_pool2d_backward");
    CHECK(ops_of(g, deep) ==
          sorted({OpKind::relu_backward, OpKind::max_pool2d_backward, OpKind::dropout2d_backward}));
    CHECK(deep.writes == std::vector<ValueId>{output_of(g, nodes_of(g, OpKind::dropout2d_backward).at(0))});
    const Launch& shallow = launch_of(s, pool_grads[1]);
    CHECK(name_of(shallow) == "max_pool2d_backward");
    CHECK(ops_of(g, shallow) == sorted({OpKind::relu_backward, OpKind::max_pool2d_backward}));
    CHECK(shallow.writes == std::vector<ValueId>{output_of(g, pool_grads[1])});

    // Each conv bias: channel_sum [+ cast] + sgd_update in one launch.
    const auto sums = nodes_of(g, OpKind::channel_sum);
    REQUIRE(sums.size() == 2);
    const std::vector<OpKind> bias_ops = compute == DType::f32
                                             ? sorted({OpKind::channel_sum, OpKind::sgd_update})
                                             : sorted({OpKind::channel_sum, OpKind::cast, OpKind::sgd_update});
    for (NodeId sum : sums) {
      const Launch& l = launch_of(s, sum);
      CHECK(name_of(l) == "channel_sum_sgd");
      CHECK(ops_of(g, l) == bias_ops);
      CHECK(l.writes.empty());
      CHECK(l.updates.size() == 2);  // bias and velocity
    }

    // Both conv weights' updates (with their casts) in ONE launch, after both
    // gradients, with the step advance riding on it.
    int weight_launches = 0;
    for (const Launch& l : s.launches) {
      if (name_of(l) != "conv_weight_sgd") continue;
      ++weight_launches;
      CHECK(l.lowering->describe(g, l) == "2 tensors");
      CHECK(updates(l, g.value_named("w1")));
      CHECK(updates(l, g.value_named("w2")));
      CHECK(updates(l, g.value_named("step")));
      CHECK(l.writes.empty());
    }
    CHECK(weight_launches == 1);

    // Nothing of these is left to the element-wise lowering (the linear
    // layers' relu_backward and updates stay with theirs).
    for (const Launch& l : s.launches)
      if (name_of(l) == "elementwise")
        for (NodeId n : l.nodes) {
          const Node& node = g.node(n);
          CAPTURE(op_name(node.op));
          CHECK(node.op != OpKind::channel_sum);
          CHECK_FALSE((node.op == OpKind::sgd_update && g.value(node.inputs[0]).shape.size() == 4));
          for (NodeId reader : g.consumers(node.outputs.empty() ? node.inputs[0] : node.outputs[0]))
            CHECK(g.node(reader).op != OpKind::max_pool2d_backward);
        }
  }
}

TEST_CASE("a lone dropout2d, a lone max-pool and its backward, and a channel sum without SGD take their own launches") {
  Graph g;
  const ValueId x = g.input("x", {3, 5, 9, 7}, DType::f16);
  const ValueId step = g.state("step", {1}, DType::i32);
  const DropoutAttrs drop{0.25, 7, 1};
  const ValueId dropped = g.append_node(OpKind::dropout2d, {x, step}, drop).front();
  const ValueId back = g.append_node(OpKind::dropout2d_backward, {dropped, step}, drop).front();
  const ValueId pooled = g.append_node(OpKind::max_pool2d, {back}, Pool2dAttrs{3, 2}).front();
  const ValueId pool_grad = g.append_node(OpKind::max_pool2d_backward, {pooled, back}, Pool2dAttrs{3, 2}).front();
  const ValueId sum = g.append_node(OpKind::channel_sum, {pool_grad}, NoAttrs{}).front();
  g.mark_output(dropped);
  g.mark_output(pooled);
  g.mark_output(sum);
  const auto lowered = lower_cnn(g);
  std::vector<std::string> names;
  for (const Launch& l : lowered->schedule.launches) names.push_back(name_of(l));
  // Nothing to fold: the pooling's input comes from a dropout2d_backward (only
  // a forward dropout2d folds in), its backward's gradient from the pooling
  // itself (not a relu_backward) and goes to a channel sum, whose result is a
  // graph output (no update to fuse).
  CHECK(names ==
        std::vector<std::string>{"dropout2d", "dropout2d", "max_pool2d", "max_pool2d_backward", "channel_sum"});
}

// (No ';' in a test name: ctest's doctest discovery cuts the name there and
// then runs no test case at all, which passes.)
TEST_CASE("conv-shaped Adam updates run in adam_multi_tensor, the conv bias sums with their casts alone") {
  OptimizerSpec adam;
  adam.kind = OptimizerKind::adam;
  adam.lr = 1e-3;
  const Graph g = build_sequential_training_stages(mnist_cnn(), adam).fused;
  const auto lowered = lower_cnn(g);
  for (const char* conv_weight : {"w1", "w2"}) {
    CAPTURE(conv_weight);
    const ValueId w = g.value_named(conv_weight);
    const auto adam_nodes = nodes_of(g, OpKind::adam_update);
    const auto update = std::find_if(adam_nodes.begin(), adam_nodes.end(),
                                     [&](NodeId n) { return g.node(n).inputs.at(0) == w; });
    REQUIRE(update != adam_nodes.end());
    const Launch& adam_launch = launch_of(lowered->schedule, *update);
    CHECK(name_of(adam_launch) == "adam_multi_tensor");
    CHECK(updates(adam_launch, w));
  }
  for (NodeId sum : nodes_of(g, OpKind::channel_sum)) {  // with the f16 -> f32 cast of the fp32 master bias
    const Launch& l = launch_of(lowered->schedule, sum);
    CHECK(name_of(l) == "channel_sum");
    CHECK(ops_of(g, l) == sorted({OpKind::channel_sum, OpKind::cast}));
    CHECK(l.writes.size() == 1);
    CHECK(g.value(l.writes.at(0)).dtype == DType::f32);
  }
  for (const Launch& l : lowered->schedule.launches) CHECK(name_of(l) != "conv_weight_sgd");
}

TEST_CASE("the reference MLP's schedules take none of the CNN lowerings") {
  const std::vector<std::string> cnn = {"max_pool2d", "max_pool2d_backward", "dropout2d", "channel_sum_sgd",
                                        "channel_sum", "conv_weight_sgd"};
  for (const double momentum : {0.0, 0.9}) {
    const Graph g = reference_fused(momentum, DType::f32);
    for (const BackendOptions& o : {BackendOptions{}, two_pass()})
      for (const Launch& l : lower(g, o).schedule.launches)
        CHECK(std::find(cnn.begin(), cnn.end(), name_of(l)) == cnn.end());
  }
}

TEST_CASE("conv -> relu -> max-pool: the relu_backward after the pooling's backward joins its launch") {
  // configs/mnist_cnn_fast.yaml's order (the relu before the pooling, fused
  // into the conv forward there), with Adam: the conv bias sums stay alone.
  SequentialSpec spec = mnist_cnn();
  LayerSpec conv = spec.layers[0], pool = spec.layers[1], relu = spec.layers[2];
  conv.padding = 2;
  spec.layers = {conv, relu, pool, conv, relu, pool, spec.layers[7], spec.layers[8], relu, spec.layers[11]};
  spec.layers[3].out = 20;
  OptimizerSpec adam;
  adam.kind = OptimizerKind::adamw;
  const Graph g = build_sequential_training_stages(spec, adam).fused;
  const auto lowered = lower_cnn(g);
  const auto pool_grads = nodes_of(g, OpKind::max_pool2d_backward);
  REQUIRE(pool_grads.size() == 2);
  for (NodeId n : pool_grads) {
    const Launch& l = launch_of(lowered->schedule, n);
    CHECK(name_of(l) == "max_pool2d_backward");
    CHECK(ops_of(g, l) == sorted({OpKind::max_pool2d_backward, OpKind::relu_backward}));
    CHECK(l.lowering->describe(g, l) == "k=2,s=2+relu_backward");
    CHECK_FALSE(writes(l, output_of(g, n)));  // the pooling's gradient lives only in the kernel
  }
  for (NodeId n : nodes_of(g, OpKind::max_pool2d))
    CHECK(ops_of(g, launch_of(lowered->schedule, n)) == sorted({OpKind::max_pool2d}));
}

TEST_CASE("the CNN's reshape/flatten are views sharing their input's buffer, its casts one launch, its convs cuDNN's") {
  for (const DType compute : {DType::f16, DType::bf16, DType::f32}) {
    CAPTURE(dtype_name(compute));
    const Graph g = build_sequential_training_stages(mnist_cnn(compute), {0.01, 0.5, 0.0}).fused;
    const auto lowered = lower_cnn(g);
    const Schedule& s = lowered->schedule;
    std::vector<ValueId> views;
    for (const OpKind op : {OpKind::reshape, OpKind::flatten})
      for (NodeId n : nodes_of(g, op)) {
        const Launch& l = launch_of(s, n);
        CHECK(name_of(l) == "view");
        REQUIRE(l.aliases.size() == 1);
        CHECK(l.aliases[0] == std::pair<ValueId, ValueId>{output_of(g, n), g.node(n).inputs[0]});
        views.push_back(output_of(g, n));
      }
    CHECK(views.size() == 3);  // the input's reshape, the flatten and its gradient's reshape
    std::vector<std::size_t> bytes, masks;
    for (const Value& v : g.values()) bytes.push_back(static_cast<std::size_t>(element_count(v.shape)) * dtype_size(v.dtype));
    for (const AuxBuffer& aux : s.aux) masks.push_back(cuda::relu_aux_bytes(aux.rows, aux.cols));
    const ArenaRequest req = arena_request(g, s, bytes, masks);
    for (ValueId v : views) {
      const ValueId source = g.node(g.value(v).producer).inputs[0];
      CAPTURE(g.value(v).name);
      CHECK(req.buffer_of_value[static_cast<std::size_t>(v)] >= 0);
      CHECK(req.buffer_of_value[static_cast<std::size_t>(v)] == req.buffer_of_value[static_cast<std::size_t>(source)]);
    }
    // The shared buffer lives until the view's last reader: the first conv's
    // weight gradient reads the reshaped input near the end of the step.
    const ValueId reshaped = views.front();
    int last_reader = -1;
    for (std::size_t i = 0; i < s.launches.size(); ++i)
      if (std::find(s.launches[i].reads.begin(), s.launches[i].reads.end(), reshaped) != s.launches[i].reads.end())
        last_reader = static_cast<int>(i);
    CHECK(last_reader > static_cast<int>(s.launches.size()) / 2);
    CHECK(req.buffers[static_cast<std::size_t>(req.buffer_of_value[static_cast<std::size_t>(reshaped)])].last >= last_reader);
    int cast_launches = 0;
    for (const Launch& l : s.launches) cast_launches += name_of(l) == "cast_params";
    CHECK(cast_launches == (compute == DType::f32 ? 0 : 1));  // fp32 compute reads the fp32 weights directly
    // backend.conv_kernels auto: the report CNN's few channels (1 x 10, 10 x 20) are our kernels'.
    for (const OpKind op : {OpKind::conv2d, OpKind::conv2d_backward_data, OpKind::conv2d_backward_filter})
      for (NodeId n : nodes_of(g, op)) CHECK(name_of(launch_of(s, n)) == "conv_implicit_gemm");
  }
}
