// The gradient stream of a one-GPU training step (runtime/cuda/stream_plan.hpp,
// runtime/plan/update_branches.hpp), no GPU needed: which launches only feed
// the parameter updates, where each is forked from the step's stream and
// joined back, and that the memory plan keeps their buffers to themselves
// in between. Each network's schedule is checked against the rules from the
// launches' reads and writes alone (a hand-built reference, not the plan's own
// helpers), so a wrong fork, join or buffer reuse shows on any network.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <string>

#include "graph/optimizer_pass.hpp"
#include "models/mlp_program.hpp"
#include "runtime/cuda/lowering.hpp"
#include "runtime/cuda/stream_plan.hpp"
#include "runtime/plan/memory_plan.hpp"
#include "runtime/plan/update_branches.hpp"
#include "models/sequential_program.hpp"
#include "tests/runtime/channels_last_networks.hpp"
#include "tests/runtime/report_cnn.hpp"
#include "tests/runtime/schedule_test_support.hpp"
#include "tests/runtime/stream_order.hpp"

using namespace sg;

namespace {

using test::conflict;  // tests/runtime/stream_order.hpp

bool has_op(const Graph& g, const Launch& l, OpKind op) {
  return std::any_of(l.nodes.begin(), l.nodes.end(), [&](NodeId n) { return g.node(n).op == op; });
}

// The rules every gradient-stream plan keeps, on one schedule.
void check_plan(const Graph& g, const Schedule& s, const cuda::StreamPlan& plan) {
  const std::size_t n = s.launches.size();
  REQUIRE(plan.on_gradient_stream.size() == n);
  for (std::size_t k = 0; k < n; ++k) {
    const Launch& l = s.launches[k];
    INFO("L" << k << " " << l.lowering->name());
    // Nothing that changes the data-gradient chain leaves the step's stream.
    for (OpKind op : {OpKind::conv2d_backward_data, OpKind::relu_backward, OpKind::max_pool2d_backward,
                      OpKind::softmax_xent_backward, OpKind::batch_indices})
      if (has_op(g, l, op)) CHECK_FALSE(plan.on_gradient_stream[k]);
    if (!plan.on_gradient_stream[k]) continue;
    CHECK(l.aux_read < 0);
    CHECK(l.aux_write < 0);
    const std::size_t fork = plan.fork_before[k], join = plan.join_before[k];
    CHECK(fork <= k);
    // Its stream runs in (fork, index) order: never ahead of an earlier gradient launch it conflicts with;
    // one of the other gradient stream (lane) it waits for.
    for (std::size_t j = 0; j < k; ++j)
      if (plan.on_gradient_stream[j] && conflict(s.launches[j], l)) {
        CHECK(fork >= plan.fork_before[j]);
        if (plan.gradient_lane[j] != plan.gradient_lane[k])
          CHECK(std::find(plan.waits_for[k].begin(), plan.waits_for[k].end(), j) != plan.waits_for[k].end());
      }
    CHECK(join > k);
    CHECK(join <= n);
    // Forked as early as it may be: the step-stream launch just before the fork conflicts with it (or
    // an earlier gradient launch it conflicts with forks there) ...
    for (std::size_t j = fork; j < k; ++j)
      if (plan.on_step_stream(j)) CHECK_FALSE(conflict(s.launches[j], l));
    if (fork > 0) {
      bool held = plan.on_step_stream(fork - 1) && conflict(s.launches[fork - 1], l);
      for (std::size_t j = 0; j < k; ++j)
        held = held || (plan.on_gradient_stream[j] && plan.fork_before[j] == fork && conflict(s.launches[j], l));
      CHECK(held);
    }
    // ... and every later step-stream launch that conflicts with it waits: the join is at the first.
    for (std::size_t j = k + 1; j < n; ++j)
      if (plan.on_step_stream(j) && conflict(s.launches[j], l)) {
        CHECK(join <= j);
        break;
      }
    if (join < n) CHECK(conflict(s.launches[join], l));
    for (std::size_t j = k + 1; j < join; ++j)
      if (plan.on_step_stream(j)) CHECK_FALSE(conflict(s.launches[j], l));
  }
  // A gradient launch has the step's stream beside it: none forks after the step stream's last launch.
  std::size_t last_step = 0;
  for (std::size_t j = 0; j < n; ++j)
    if (plan.on_step_stream(j)) last_step = j;
  for (std::size_t k = 0; k < n; ++k)
    if (plan.on_gradient_stream[k]) CHECK(plan.fork_before[k] <= last_step);
  // The forks and joins the program records: each gradient launch forked once, joined once.
  std::size_t forked = 0, joined = 0;
  for (std::size_t i = 0; i <= n; ++i) {
    forked += plan.forked_before(i).size();
    joined += plan.joined_before(i).size();
  }
  const auto on =
      static_cast<std::size_t>(std::count(plan.on_gradient_stream.begin(), plan.on_gradient_stream.end(), true));
  CHECK(forked == on);
  CHECK(joined == on);
}

// The arena: a gradient launch's buffers share bytes with no buffer live between its fork and its join.
void check_memory(const Graph& g, const Schedule& s, const cuda::StreamPlan& plan) {
  const std::vector<std::size_t> bytes(g.values().size(), 64);
  const std::vector<std::size_t> masks(s.aux.size(), 64);
  ArenaRequest request = arena_request(g, s, bytes, masks);
  const ArenaRequest serial = request;
  cuda::keep_live_until_joined(request, s, plan);
  const MemoryPlan memory = plan_memory(request.buffers);
  const int last = static_cast<int>(s.launches.size()) - 1;
  for (std::size_t k = 0; k < s.launches.size(); ++k) {
    if (!plan.on_gradient_stream[k]) continue;
    const Launch& l = s.launches[k];
    const int from = static_cast<int>(plan.fork_before[k]),
              until = std::min(static_cast<int>(plan.join_before[k]), last);
    for (const auto* ids : {&l.reads, &l.writes, &l.scratch})
      for (ValueId v : *ids) {
        const int b = request.buffer_of_value[static_cast<std::size_t>(v)];
        if (b < 0) continue;
        const ArenaSlot& mine = memory.slots[static_cast<std::size_t>(b)];
        for (std::size_t o = 0; o < serial.buffers.size(); ++o) {
          if (static_cast<int>(o) == b) continue;
          // Live beside it in the serial plan (what the other launches assume) ...
          const auto& other = serial.buffers[o];
          if (other.last < from || other.first > until) continue;
          // ... so it may not share bytes.
          const ArenaSlot& theirs = memory.slots[o];
          INFO("L" << k << " '" << g.value(v).name << "' beside '" << other.name << "'");
          CHECK_FALSE((theirs.offset < mine.offset + mine.bytes && mine.offset < theirs.offset + theirs.bytes));
        }
      }
  }
}

struct Network {
  std::string name;
  TrainingProgram program;
};

BackendOptions streams(bool weight_gradients, bool independent) {
  BackendOptions o;
  o.weight_gradient_stream = weight_gradients;
  o.independent_launch_stream = independent;
  return o;
}

std::vector<Network> networks() {
  std::vector<Network> out;
  for (const OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::adamw, OptimizerKind::rmsprop}) {
    SequentialTraining t = test::report_cnn();
    t.optimizer.kind = kind;
    if (kind == OptimizerKind::rmsprop) t.optimizer.clip_grad_norm = 1.0;
    out.push_back({fmt::format("report CNN, {}", optimizer_name(kind)),
                   build_sequential_program(t, 1280, 200, ProgramTarget::cuda)});
  }
  for (const int variant : {0, 1, 2}) {  // SGD in f16, Adam with fp32 master weights, clipped momentum SGD
    MlpTraining t;
    t.mlp.layers = {784, 128, 96, 10};
    t.mlp.batch = 64;
    if (variant == 1) {
      t.optimizer.kind = OptimizerKind::adam;
      t.mlp.weight_dtype = DType::f32;
    }
    if (variant == 2) {
      t.optimizer.momentum = 0.9;
      t.optimizer.clip_grad_norm = 0.5;
    }
    out.push_back({fmt::format("MLP variant {}", variant), build_mlp_program(t, 6400, 1000, ProgramTarget::cuda)});
  }
  // Channels-last CNNs, whose weight gradients of 8+ channels come out [O,KH,KW,C] and reach their updates
  // through a to_channels_first (graph/filter_layout_pass.hpp): AdamW with fp32 master weights; a small
  // mnist_resnet with momentum SGD in f16.
  for (const int variant : {0, 1})
    out.push_back({fmt::format("channels-last CNN variant {}", variant),
                   test::channels_last_training_program(variant)});
  return out;
}

// Checks every network of networks(), its training graph lowered by the CUDA lowerings (as on a machine
// without a GPU), its name in each failure's message.
void for_each_network(const std::function<void(const std::string&, const Graph&, const Schedule&)>& check) {
  for (const Network& net : networks()) {
    INFO(net.name);
    const schedule_test::Lowered lowered = schedule_test::lower(net.program.train, BackendOptions{});
    check(net.name, net.program.train, lowered.schedule);
  }
}

}  // namespace

TEST_CASE(
    "gradient stream: weight gradients and updates leave the step's stream, forked after what they read "
    "and joined before what reads or overwrites their values") {
  for_each_network([&](const std::string& name, const Graph& g, const Schedule& s) {
    const cuda::StreamPlan plan = cuda::plan_streams(g, s, streams(true, false));
    CHECK_FALSE(plan.forks());
    REQUIRE(plan.splits_gradients());
    check_plan(g, s, plan);
    check_memory(g, s, plan);
    test::check_stream_order(s, plan);
    // The chain's end: the last launch of the step's stream that is no branch launch.
    const std::vector<bool> branch = update_branch_launches(g, s);
    std::size_t chain_end = 0;
    for (std::size_t k = 0; k < s.launches.size(); ++k)
      if (plan.on_step_stream(k) && !branch[k]) chain_end = k;
    std::string side, tail;
    for (std::size_t k = 0; k < s.launches.size(); ++k) {
      const Launch& l = s.launches[k];
      INFO("L" << k << " " << l.lowering->name());
      // Every update rule's launch (none of them reads a ReLU mask) is on the gradient stream, and so is
      // every launch whose only product is a weight gradient ...
      const bool updates =
          std::any_of(l.nodes.begin(), l.nodes.end(), [&](NodeId x) { return is_update_rule(g.node(x).op); });
      const bool wgrad = has_op(g, l, OpKind::conv2d_backward_filter) && !has_op(g, l, OpKind::conv2d_backward_data);
      if (plan.on_gradient_stream[k]) side += fmt::format(" L{}", k);
      if (!((updates && l.aux_read < 0) || wgrad) || plan.on_gradient_stream[k]) continue;
      // ... but where it would fork after the chain's end, with nothing beside it: then it stays on the step's
      // stream, after a launch of the step's stream it conflicts with (the chain's last or one such after it).
      tail += fmt::format(" L{}", k);
      CHECK(k > chain_end);
      bool after = false;
      for (std::size_t j = chain_end; j < k; ++j)
        after = after || (plan.on_step_stream(j) && conflict(s.launches[j], l));
      CHECK(after);
    }
    MESSAGE(name << ": " << s.launches.size() << " launches, on the gradient stream:" << side
                     << "; branch launches after the chain's end on the step's stream:" << tail);
    // Switched off: one stream.
    const cuda::StreamPlan off = cuda::plan_streams(g, s, streams(false, false));
    CHECK_FALSE(off.splits_gradients());
    for (std::size_t i = 0; i <= s.launches.size(); ++i) {
      CHECK(off.joined_before(i).empty());
      CHECK(off.forked_before(i).empty());
    }
  });
}

TEST_CASE(
    "two gradient streams: a weight gradient and its bias's column sums, forked at one place, run side by side, "
    "with one, every branch launch on the one") {
  std::size_t side_by_side = 0;
  for_each_network([&](const std::string&, const Graph& g, const Schedule& s) {
    BackendOptions one = streams(true, true), two = one;
    one.gradient_streams = 1;
    two.gradient_streams = 2;
    const cuda::StreamPlan single = cuda::plan_streams(g, s, one), plan = cuda::plan_streams(g, s, two);
    CHECK(single.gradient_lanes() == 1);
    CHECK(plan.gradient_lanes() >= 1);
    // The default (0, auto) in a single process: two.
    CHECK(cuda::plan_streams(g, s, streams(true, true)).gradient_lanes() == plan.gradient_lanes());
    // The same launches leave the step's stream, forked and joined at the same places.
    CHECK(plan.on_gradient_stream == single.on_gradient_stream);
    CHECK(plan.fork_before == single.fork_before);
    CHECK(plan.join_before == single.join_before);
    check_plan(g, s, plan);
    check_memory(g, s, plan);
    test::check_stream_order(s, plan);
    for (std::size_t k = 0; k < s.launches.size(); ++k) {
      if (!plan.on_gradient_stream[k] || s.launches[k].lowering->name() != "column_sum") continue;
      INFO("L" << k << " column_sum");
      // The weight gradient forked at the same place runs on the other lane.
      for (std::size_t j = 0; j < s.launches.size(); ++j)
        if (plan.on_gradient_stream[j] && plan.fork_before[j] == plan.fork_before[k] &&
            has_op(g, s.launches[j], OpKind::conv2d_backward_filter)) {
          CHECK(plan.gradient_lane[j] != plan.gradient_lane[k]);
          ++side_by_side;
        }
    }
  });
  CHECK(side_by_side >= 1);  // the channels-last CNN's second convolution (its first is the few-channel kernel's)
}

TEST_CASE("gradient stream: a value feeds only the updates through casts and sums, not through a matmul") {
  MlpTraining t;
  t.mlp.layers = {20, 16, 4};
  t.mlp.batch = 8;
  t.mlp.weight_dtype = DType::f32;  // fp32 master weights: each gradient is cast before its update
  const Graph g = build_mlp_program(t, 64, 16, ProgramTarget::cuda).train;
  const std::vector<bool> feeds = feeds_only_updates(g);
  std::size_t gradients = 0;
  for (const Node& n : g.nodes()) {
    if (!is_update_rule(n.op)) continue;
    const ValueId grad = n.inputs[1];
    CHECK(feeds[static_cast<std::size_t>(grad)]);
    const Node& producer = g.node(g.value(grad).producer);
    INFO("'" << g.value(grad).name << "' from " << op_name(producer.op));
    // Through the widening cast to the matmul or the column sum, whose output feeds only the update ...
    if (producer.op == OpKind::cast) CHECK(feeds[static_cast<std::size_t>(producer.inputs[0])]);
    ++gradients;
  }
  CHECK(gradients == 4);
  // ... while the matmul's and the sums' input (a layer's dY, also read by the data gradient) and the
  // activations do not, nor does the loss.
  for (const Node& n : g.nodes()) {
    if (n.op == OpKind::matmul || n.op == OpKind::relu_backward || n.op == OpKind::softmax_xent_backward)
      for (ValueId in : n.inputs) CHECK_FALSE(feeds[static_cast<std::size_t>(in)]);
    if (n.op == OpKind::softmax_xent) CHECK_FALSE(feeds[static_cast<std::size_t>(n.outputs[0])]);
  }
}

TEST_CASE(
    "gradient stream: launches that depend on no earlier launch (the parameter casts) run on it from the "
    "step's start, beside the batch fetch") {
  std::size_t networks_with_casts = 0;
  for_each_network([&](const std::string&, const Graph& g, const Schedule& s) {
    const std::size_t n = s.launches.size();
    // The reference: a launch that does something and conflicts with no earlier launch (not the first).
    std::vector<bool> independent(n, false);
    for (std::size_t k = 1; k < n; ++k) {
      const Launch& l = s.launches[k];
      bool free = !l.writes.empty() || !l.updates.empty();
      for (std::size_t j = 0; j < k; ++j) free = free && !conflict(s.launches[j], l);
      independent[k] = free;
    }
    CHECK(cuda::independent_launches(s) == independent);
    bool casts = false;
    for (std::size_t k = 0; k < n; ++k)
      if (s.launches[k].lowering->name() == "cast_params") {
        casts = true;
        CHECK(k > 0);
        CHECK(independent[k]);  // they read only parameters, which nothing before them writes
      }
    networks_with_casts += casts ? 1 : 0;
    const std::vector<bool> prepared = cuda::parameter_launches(g, s);
    for (const bool weight_gradients : {false, true}) {
      INFO("weight gradient stream " << weight_gradients);
      const cuda::StreamPlan plan = cuda::plan_streams(g, s, streams(weight_gradients, true));
      const cuda::StreamPlan without = cuda::plan_streams(g, s, streams(weight_gradients, false));
      check_plan(g, s, plan);
      check_memory(g, s, plan);
      for (std::size_t k = 0; k < n; ++k) {
        INFO("L" << k << " " << s.launches[k].lowering->name());
        // (and so do launches computed from the parameters alone: the filters' copies, the test below)
        CHECK(plan.on_gradient_stream[k] == (without.on_gradient_stream[k] || independent[k] || prepared[k]));
        // An independent launch before every other gradient-stream launch forks at the step's start.
        const bool first_on_stream =
            std::find(plan.on_gradient_stream.begin(), plan.on_gradient_stream.begin() + static_cast<long>(k),
                      true) == plan.on_gradient_stream.begin() + static_cast<long>(k);
        if (independent[k] && first_on_stream) CHECK(plan.fork_before[k] == 0);
      }
    }
  });
  CHECK(networks_with_casts >= 1);  // the Adam MLP with fp32 master weights casts them for its forward
}

TEST_CASE(
    "gradient stream: the filters' channels-last copies (computed from the parameters alone) run on it, forked "
    "after the casts they read and joined before their first convolution") {
  // fp32 master weights (AdamW); f16 weights (SGD); mnist_resnet in small; the first as rank 1 of 2 (its
  // all-reduces on the communication stream).
  for (const int variant : {0, 1, 2, 3}) {
    SequentialTraining t;
    if (variant == 3) {
      t.data_rank = 1;
      t.data_ranks = 2;
    }
    t.model.input_shape = {1, 28, 28};
    t.model.layers = variant == 2 ? test::batch_norm_residual_layers(16) : test::two_conv_layers();
    t.model.batch = 64;
    t.model.weight_dtype = variant == 1 ? DType::f16 : DType::f32;
    t.optimizer.kind = variant == 1 ? OptimizerKind::sgd : OptimizerKind::adamw;
    INFO("variant " << variant);
    const TrainingProgram p = build_sequential_program(t, 6400, 1000, ProgramTarget::cuda);
    REQUIRE(p.channels_last);
    const Graph& g = p.channels_last->train;
    const schedule_test::Lowered lowered = schedule_test::lower(g, BackendOptions{});
    const Schedule& s = lowered.schedule;
    const std::vector<bool> prepared = cuda::parameter_launches(g, s);
    const cuda::StreamPlan plan = cuda::plan_streams(g, s, streams(true, true));
    CHECK(plan.forks() == (variant == 3));
    if (variant == 3) {
      CHECK(plan.gradient_lanes() == 1);  // auto: a data-parallel rank keeps one gradient stream
      BackendOptions two = streams(true, true);
      two.gradient_streams = 2;  // asked for: two lanes in a rank too, its all-reduces waiting on either
      const cuda::StreamPlan lanes = cuda::plan_streams(g, s, two);
      CHECK(lanes.gradient_lanes() == 2);
      test::check_stream_order(s, lanes);
    }
    if (variant != 3) {
      check_plan(g, s, plan);
      check_memory(g, s, plan);
    }
    test::check_stream_order(s, plan);
    // The values computed (through any node) from the batch: the images and labels, or the state (the step).
    std::vector<bool> from_batch(g.values().size(), false);
    for (const Value& v : g.values()) from_batch[v.id] = v.role == Role::input || v.role == Role::label;
    for (const Node& n : g.nodes())
      for (ValueId out : n.outputs)
        for (ValueId in : n.inputs)
          from_batch[out] = from_batch[out] || from_batch[in] || g.value(in).role == Role::state;
    std::size_t copies = 0;
    for (std::size_t k = 0; k < s.launches.size(); ++k) {
      const Launch& l = s.launches[k];
      INFO("L" << k << " " << l.lowering->name());
      const bool copy = has_op(g, l, OpKind::to_channels_last) && l.lowering->name() == "channels_permute" &&
                        g.value(l.writes.front()).name.ends_with("_krsc");
      const bool batch = std::any_of(l.reads.begin(), l.reads.end(), [&](ValueId v) { return from_batch[v]; });
      if (copy) {
        ++copies;
        CHECK(l.lowering->describe(g, l) == "filter [O,C,KH,KW]->[O,KH,KW,C]");  // as inspect -f schedule says
        CHECK(prepared[k]);
        CHECK(plan.on_gradient_stream[k]);
        // Forked before the convolution that reads it, joined right before the first launch that does.
        std::size_t first_reader = s.launches.size();
        for (std::size_t j = k + 1; j < s.launches.size() && first_reader == s.launches.size(); ++j)
          if (std::find(s.launches[j].reads.begin(), s.launches[j].reads.end(), l.writes.front()) !=
              s.launches[j].reads.end())
            first_reader = j;
        CHECK(plan.fork_before[k] <= k);
        CHECK(plan.join_before[k] == first_reader);
        CHECK(g.node(s.launches[first_reader].nodes.front()).op == OpKind::conv2d);
      }
      if (prepared[k]) CHECK_FALSE(batch);  // nothing that reads the batch or its activations is "prepared"
      if (l.lowering->name() == "cast_params") CHECK(prepared[k]);
    }
    // The residual block's two 16-channel convolutions and the stage after it; two_conv's second layer.
    CHECK(copies == (variant == 2 ? 3 : 1));
  }
}
