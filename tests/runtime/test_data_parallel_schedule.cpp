// The CUDA cover of a data-parallel training step (issue 25), no GPU needed:
// every all_reduce_mean bucket is its own nccl_all_reduce launch, and no
// launch reads a value before the launch that produces it (in particular no
// update runs before its bucket's all-reduce: the fused update lowerings,
// which read no gradient buffer, take nothing across it). World size 1 (the
// default, no --gpus) keeps the single-process schedule. Each all-reduce runs
// on the communication stream (runtime/cuda/stream_plan.hpp): forked after
// its bucket, joined before the first reader of the reduced gradients, its
// buffers kept out of reuse in between; the last layer's is in flight while
// the earlier layers' backward runs.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "models/mlp_program.hpp"
#include "tests/runtime/report_cnn.hpp"
#include "runtime/cuda/lowering.hpp"
#include "runtime/cuda/stream_plan.hpp"
#include "runtime/plan/graph_queries.hpp"
#include "runtime/plan/memory_plan.hpp"
#include "tests/runtime/stream_order.hpp"

using namespace sg;

namespace {

struct Lowered {
  std::vector<std::unique_ptr<cuda::CudaLowering>> lowerings;
  Schedule schedule;
};

Lowered lower(const Graph& g, const BackendOptions& options = {}) {
  Lowered l;
  l.lowerings = cuda::cuda_lowerings(options, /*device_present=*/false);
  l.schedule = build_schedule(g, cuda::as_lowerings(l.lowerings));
  return l;
}

MlpTraining mlp(std::int64_t batch, std::int64_t ranks) {
  MlpTraining t;
  t.mlp.layers = {784, 128, 128, 128, 10};
  t.mlp.batch = batch;
  t.data_rank = ranks > 0 ? ranks - 1 : 0;
  t.data_ranks = ranks;
  return t;
}

// Every value a launch reads was produced by an earlier launch (or is graph-owned).
void check_dependencies(const Graph& g, const Schedule& s) {
  std::map<NodeId, std::size_t> launch_of;
  for (std::size_t i = 0; i < s.launches.size(); ++i) {
    for (NodeId n : s.launches[i].nodes) launch_of[n] = i;
    for (NodeId n : s.launches[i].riders) launch_of[n] = i;
  }
  for (std::size_t i = 0; i < s.launches.size(); ++i)
    for (NodeId n : s.launches[i].nodes)
      for (ValueId v : g.node(n).inputs) {
        const NodeId producer = g.value(v).producer;
        if (producer < 0) continue;
        INFO("launch " << i << " (" << s.launches[i].lowering->name() << ") reads '" << g.value(v).name << "'");
        const Launch& maker = s.launches[launch_of.at(producer)];
        if (std::count(maker.carries.begin(), maker.carries.end(), v)) {  // written by the step before
          CHECK(launch_of.at(producer) > i);
          continue;
        }
        CHECK(launch_of.at(producer) <= i);
      }
}

// A rank's step lowered with backend.update_per_bucket as given, every read after its write
// (check_dependencies) and every two launches touching one value in order through the streams,
// with the rank's one gradient stream (auto) and with two asked for (backend.gradient_streams: 2:
// the all-reduces then wait for gradients in either lane).
struct CheckedSchedule {
  Lowered lowered;
  cuda::StreamPlan plan;
};
CheckedSchedule checked_schedule(const Graph& g, bool update_per_bucket) {
  BackendOptions options;
  options.update_per_bucket = update_per_bucket;
  CheckedSchedule c{lower(g, options), {}};
  check_dependencies(g, c.lowered.schedule);
  c.plan = cuda::plan_streams(g, c.lowered.schedule, options);
  CHECK(c.plan.gradient_lanes() <= 1);
  test::check_stream_order(c.lowered.schedule, c.plan);
  options.gradient_streams = 2;
  test::check_stream_order(c.lowered.schedule, cuda::plan_streams(g, c.lowered.schedule, options));
  return c;
}

// The data-parallel rank's MLP of the checks below: 0 plain SGD, 1 momentum,
// 2 Adam, 3 fp32 master weights with clipping, 4 fp32 master weights reducing
// the f16 gradients before their casts (precision.all_reduce: compute), no
// clipping (with it the clip scale and the scaling read each widened mean, so
// the casts stay launches of their own, as variant 3's do).
MlpTraining variant_of(std::int64_t batch, int variant) {
  MlpTraining t = mlp(batch, 2);
  if (variant == 1) t.optimizer.momentum = 0.9;
  if (variant == 2) t.optimizer.kind = OptimizerKind::adam;
  if (variant >= 3) t.mlp.weight_dtype = DType::f32;
  if (variant == 3) t.optimizer.clip_grad_norm = 1.0;
  t.optimizer.reduce_in_compute_dtype = variant == 4;
  return t;
}

}  // namespace

TEST_CASE("data parallel: each gradient bucket is one nccl_all_reduce launch, before the updates that read it") {
  for (const std::int64_t batch : {32, 64, 256}) {
    for (const int variant : {0, 1, 2, 3, 4}) {  // SGD, momentum, Adam, fp32 master weights (+ clipping; f16 reduced)
      INFO("batch " << batch << ", variant " << variant);
      const MlpTraining t = variant_of(batch, variant);
      const TrainingProgram p = build_mlp_program(t, 60000, 10000, ProgramTarget::cuda);
      const Lowered l = lower(p.train);
      std::size_t all_reduce = 0;
      for (const auto& launch : l.schedule.launches) {
        const bool has = std::any_of(launch.nodes.begin(), launch.nodes.end(),
                                     [&](NodeId n) { return p.train.node(n).op == OpKind::all_reduce_mean; });
        if (!has) continue;
        ++all_reduce;
        CHECK(launch.lowering->name() == "nccl_all_reduce");
        CHECK(launch.nodes.size() == 1);
        // The gradients it reduces are in the update's dtype (f32 for master weights, else f16), or
        // in the compute dtype when the config asks.
        for (ValueId v : p.train.node(launch.nodes[0]).inputs)
          CHECK(p.train.value(v).dtype == (variant == 3 ? DType::f32 : DType::f16));
      }
      CHECK(all_reduce == t.mlp.layers.size() - 1);  // one bucket per layer
      if (variant == 4)  // the widening casts of the means ride in the update stage's launch, none alone
        for (const auto& launch : l.schedule.launches)
          for (NodeId n : launch.nodes)
            if (p.train.node(n).op == OpKind::cast && p.train.value(p.train.node(n).outputs[0]).role == Role::grad)
              CHECK(launch.lowering->name() == "sgd_multi_tensor");  // (plain SGD's update-stage launch)
      if (batch == 32 && variant == 0) {
        std::string names;
        for (const auto& launch : l.schedule.launches) names += std::string(launch.lowering->name()) + " ";
        MESSAGE("784-128-128-128-10 batch 32 SGD, rank 1 of 2: " << l.schedule.launches.size() << " launches: " << names);
      }
      check_dependencies(p.train, l.schedule);
    }
  }
}

TEST_CASE("data parallel: world size 1 through the data-parallel path still reduces, a plain run is unchanged") {
  // --gpus 1: the same graph as N ranks (all-reduce over one rank), so one GPU runs the whole NCCL path.
  const TrainingProgram one = build_mlp_program(mlp(32, 1), 60000, 10000, ProgramTarget::cuda);
  const Lowered l1 = lower(one.train);
  std::size_t reduces = 0;
  for (const auto& launch : l1.schedule.launches) reduces += launch.lowering->name() == "nccl_all_reduce";
  CHECK(reduces == 4);
  check_dependencies(one.train, l1.schedule);
  // No --gpus: no all-reduce, and the schedule is exactly the single-process one.
  const TrainingProgram plain = build_mlp_program(mlp(32, 0), 60000, 10000, ProgramTarget::cuda);
  const Lowered lp = lower(plain.train);
  for (const auto& launch : lp.schedule.launches) CHECK(launch.lowering->name() != "nccl_all_reduce");
  // The reduced gradients must exist before their updates, so the fused updates give way to separate launches.
  CHECK(lp.schedule.launches.size() + 4 < l1.schedule.launches.size());
}

namespace {

bool reads_any(const Launch& l, const std::vector<ValueId>& values) {
  return std::any_of(l.reads.begin(), l.reads.end(),
                     [&](ValueId v) { return std::find(values.begin(), values.end(), v) != values.end(); });
}

// The schedule with the streams: "L7 nccl_all_reduce [communication; joined before L15]", "[join L3]" marks.
std::string annotated(const Graph& g, const Schedule& s, const cuda::StreamPlan& plan) {
  std::string out;
  for (std::size_t i = 0; i <= s.launches.size(); ++i) {
    for (std::size_t c : plan.joined_before(i)) out += fmt::format("  -- the step stream waits for L{}\n", c);
    if (i == s.launches.size()) break;
    const Launch& l = s.launches[i];
    std::vector<std::string_view> ops;
    for (NodeId n : l.nodes) ops.push_back(op_name(g.node(n).op));
    out += fmt::format("  L{} {} ({})", i, l.lowering->name(), fmt::join(ops, "+"));
    if (plan.on_communication[i])
      out += fmt::format("  <- forked to the communication stream, joined before {}",
                         plan.join_before[i] == s.launches.size() ? std::string("the step's end")
                                                                   : fmt::format("L{}", plan.join_before[i]));
    out += "\n";
  }
  return out;
}

}  // namespace

TEST_CASE("data parallel: each all-reduce is forked to the communication stream after its bucket and joined before "
          "its first reader, the last layer's overlaps the earlier layers' backward") {
  for (const std::int64_t batch : {32, 256}) {
    for (const int variant : {0, 1, 2, 3, 4}) {  // SGD, momentum, Adam, fp32 master weights (+ clipping; f16 reduced)
      INFO("batch " << batch << ", variant " << variant);
      const MlpTraining t = variant_of(batch, variant);
      const TrainingProgram p = build_mlp_program(t, 60000, 10000, ProgramTarget::cuda);
      const Lowered l = lower(p.train);
      const Schedule& s = l.schedule;
      const cuda::StreamPlan plan = cuda::plan_streams(p.train, s, BackendOptions{});
      REQUIRE(plan.on_communication.size() == s.launches.size());
      // The weight gradients leave for the gradient stream as in a single process; every launch that
      // touches what another touches still runs after it, through the three streams' forks, joins and waits.
      CHECK(plan.splits_gradients());
      test::check_stream_order(s, plan);
      std::vector<std::size_t> comms;
      for (std::size_t i = 0; i < s.launches.size(); ++i) {
        CHECK(plan.on_communication[i] == (s.launches[i].lowering->name() == "nccl_all_reduce"));
        if (plan.on_communication[i]) comms.push_back(i);
      }
      REQUIRE(comms.size() == t.mlp.layers.size() - 1);
      for (std::size_t c : comms) {
        const std::size_t join = plan.join_before[c];
        CHECK(join > c);
        // Every reader of a reduced gradient sits at or after the join ...
        for (std::size_t k = c + 1; k < s.launches.size(); ++k)
          if (reads_any(s.launches[k], s.launches[c].writes)) CHECK(k >= join);
        // ... and the join is at the first of them (the step's end only when nothing reads them).
        if (join < s.launches.size()) CHECK(reads_any(s.launches[join], s.launches[c].writes));
        // Forked where it sits: after the launches producing the gradients it reduces.
        for (ValueId v : s.launches[c].reads)
          for (std::size_t k = c; k < s.launches.size(); ++k)
            for (ValueId w : s.launches[k].writes) CHECK(w != v);
      }
      // The first all-reduce is the last layer's (the backward runs from the output layer down), and
      // the earlier layers' gradients, which the other all-reduces reduce, are all produced while it is in flight.
      const std::size_t last_layer = comms.front();
      for (std::size_t c : comms) {
        if (c == last_layer) continue;
        for (ValueId v : s.launches[c].reads) {
          const NodeId producer = p.train.value(v).producer;
          std::size_t at = 0;
          while (at < s.launches.size() &&
                 std::find(s.launches[at].nodes.begin(), s.launches[at].nodes.end(), producer) == s.launches[at].nodes.end())
            ++at;
          INFO("'" << p.train.value(v).name << "' is produced by L" << at);
          CHECK(at > last_layer);
          CHECK(at < plan.join_before[last_layer]);
        }
      }
      if (batch == 32 && (variant == 0 || variant == 2))
        MESSAGE("784-128-128-128-10 batch 32 " << std::string(variant == 0 ? "SGD" : "Adam") << ", rank 1 of 2:\n"
                                                << annotated(p.train, s, plan));
    }
  }
}

TEST_CASE("data parallel: buffers an all-reduce reads or writes stay live until its join") {
  const TrainingProgram p = build_mlp_program(mlp(64, 2), 60000, 10000, ProgramTarget::cuda);
  const Lowered l = lower(p.train);
  const cuda::StreamPlan plan = cuda::plan_streams(p.train, l.schedule, BackendOptions{});
  const std::vector<std::size_t> bytes(p.train.values().size(), 64);
  std::vector<std::size_t> masks(l.schedule.aux.size(), 64);
  ArenaRequest request = arena_request(p.train, l.schedule, bytes, masks);
  cuda::keep_live_until_joined(request, l.schedule, plan);
  const MemoryPlan memory = plan_memory(request.buffers);
  const int end = static_cast<int>(l.schedule.launches.size()) - 1;
  for (std::size_t c = 0; c < l.schedule.launches.size(); ++c) {
    if (!plan.on_communication[c]) continue;
    const Launch& comm = l.schedule.launches[c];
    for (const auto* ids : {&comm.reads, &comm.writes})
      for (ValueId v : *ids) {
        const int b = request.buffer_of_value[static_cast<std::size_t>(v)];
        REQUIRE(b >= 0);
        CHECK(request.buffers[static_cast<std::size_t>(b)].last >= std::min<int>(static_cast<int>(plan.join_before[c]), end));
        // No other buffer live between the fork and the join shares its bytes.
        const ArenaSlot& mine = memory.slots[static_cast<std::size_t>(b)];
        for (std::size_t o = 0; o < memory.buffers.size(); ++o) {
          if (static_cast<int>(o) == b) continue;
          const auto& other = memory.buffers[o];
          const bool live_beside = other.last > static_cast<int>(c) && other.first < static_cast<int>(plan.join_before[c]);
          const ArenaSlot& theirs = memory.slots[o];
          const bool overlap = theirs.offset < mine.offset + mine.bytes && mine.offset < theirs.offset + theirs.bytes;
          if (live_beside) CHECK_FALSE(overlap);
        }
      }
  }
}

TEST_CASE("a single-process schedule has no communication launch, and without the gradient stream no fork or join") {
  const TrainingProgram plain = build_mlp_program(mlp(32, 0), 60000, 10000, ProgramTarget::cuda);
  const Lowered lp = lower(plain.train);
  BackendOptions one_stream;
  one_stream.weight_gradient_stream = one_stream.independent_launch_stream = false;
  const cuda::StreamPlan plan = cuda::plan_streams(plain.train, lp.schedule, one_stream);
  CHECK_FALSE(plan.forks());
  CHECK_FALSE(plan.splits_gradients());
  for (std::size_t i = 0; i <= lp.schedule.launches.size(); ++i) CHECK(plan.joined_before(i).empty());
  CHECK_FALSE(cuda::plan_streams(plain.train, lp.schedule, BackendOptions{}).forks());
}

TEST_CASE("data parallel: a CNN rank (model.sequential) reduces each layer's gradients before its update, "
          "on the communication stream, without the fused CNN step") {
  for (const OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::adamw}) {
    INFO(optimizer_name(kind));
    SequentialTraining t = test::report_cnn();
    t.optimizer.kind = kind;
    t.data_rank = 1;
    t.data_ranks = 2;
    const TrainingProgram p = build_sequential_program(t, 1280, 200, ProgramTarget::cuda);
    const Lowered l = lower(p.train);
    const cuda::StreamPlan plan = cuda::plan_streams(p.train, l.schedule, BackendOptions{});
    CHECK(plan.splits_gradients());
    test::check_stream_order(l.schedule, plan);
    std::size_t reduces = 0;
    std::string names;
    for (std::size_t i = 0; i < l.schedule.launches.size(); ++i) {
      const std::string name(l.schedule.launches[i].lowering->name());
      names += name + " ";
      reduces += name == "nccl_all_reduce";
      CHECK(plan.on_communication[i] == (name == "nccl_all_reduce"));
      // The whole-network kernels fold the update into the gradient's pass: they must not take a rank's step.
      CHECK(name.find("cnn_step") == std::string::npos);
    }
    CHECK(reduces == 4);  // two convolutions, two linear layers
    check_dependencies(p.train, l.schedule);
    MESSAGE("report CNN, " << optimizer_name(kind) << ", rank 1 of 2: " << l.schedule.launches.size()
                           << " launches: " << names);
  }
}

TEST_CASE("data parallel: joined buckets (bucket_bytes) are one nccl_all_reduce launch each, and with the communication "
          "stream off every launch stays on the step's stream") {
  for (const int variant : {0, 1, 2, 3, 4}) {
    INFO("variant " << variant);
    MlpTraining t = variant_of(256, variant);
    t.optimizer.bucket_bytes = std::int64_t{1} << 40;  // every layer in one bucket
    const TrainingProgram p = build_mlp_program(t, 60000, 10000, ProgramTarget::cuda);
    const Lowered l = lower(p.train);
    std::size_t all_reduce = 0;
    for (const auto& launch : l.schedule.launches)
      for (NodeId n : launch.nodes)
        if (p.train.node(n).op == OpKind::all_reduce_mean) {
          ++all_reduce;
          CHECK(launch.lowering->name() == "nccl_all_reduce");
          CHECK(p.train.node(n).inputs.size() == 2 * (t.mlp.layers.size() - 1));  // every weight and bias
        }
    CHECK(all_reduce == 1);
    check_dependencies(p.train, l.schedule);
    BackendOptions off;
    off.communication_stream = false;
    const cuda::StreamPlan plan = cuda::plan_streams(p.train, l.schedule, off);
    CHECK_FALSE(plan.forks());
    test::check_stream_order(l.schedule, plan);
    // The all-reduce stays where it sits, and every weight gradient it reads is joined before it.
    for (std::size_t i = 0; i < l.schedule.launches.size(); ++i)
      if (l.schedule.launches[i].lowering->name() == "nccl_all_reduce") CHECK(plan.on_step_stream(i));
    // Both side streams off: one stream.
    off.weight_gradient_stream = off.independent_launch_stream = false;
    CHECK_FALSE(cuda::plan_streams(p.train, l.schedule, off).splits_gradients());
  }
}

TEST_CASE("data parallel: join_buffers lays each bucket's gradients and its means out as one span each") {
  for (const std::int64_t bucket_bytes : {std::int64_t{0}, std::int64_t{1} << 30}) {
    CAPTURE(bucket_bytes);
    MlpTraining t = variant_of(64, 1);
    t.optimizer.bucket_bytes = bucket_bytes;
    const TrainingProgram p = build_mlp_program(t, 60000, 10000, ProgramTarget::cuda);
    const Lowered l = lower(p.train);
    const cuda::StreamPlan plan = cuda::plan_streams(p.train, l.schedule, BackendOptions{});
    std::vector<std::size_t> bytes;
    for (const Value& v : p.train.values())
      bytes.push_back(static_cast<std::size_t>(element_count(v.shape)) * dtype_size(v.dtype));
    ArenaRequest request = arena_request(p.train, l.schedule, bytes, std::vector<std::size_t>(l.schedule.aux.size(), 64));
    cuda::keep_live_until_joined(request, l.schedule, plan);
    const std::size_t buffers_before = request.buffers.size();
    std::vector<const Node*> buckets;
    for (const Node& n : p.train.nodes())
      if (n.op == OpKind::all_reduce_mean) buckets.push_back(&n);
    REQUIRE(buckets.size() == (bucket_bytes ? 1u : 4u));
    std::size_t joined = 0;
    for (const Node* n : buckets) {
      CHECK(join_buffers(request, n->inputs));
      CHECK(join_buffers(request, n->outputs));
      joined += n->inputs.size() + n->outputs.size() - 2;
    }
    CHECK(request.buffers.size() == buffers_before - joined);
    for (int mask : request.buffer_of_mask) CHECK(mask < static_cast<int>(request.buffers.size()));
    const MemoryPlan memory = plan_memory(request.buffers);
    const auto address = [&](ValueId v) {
      const int b = request.buffer_of_value[static_cast<std::size_t>(v)];
      REQUIRE(b >= 0);
      return memory.slots[static_cast<std::size_t>(b)].offset + request.offset_in_buffer[static_cast<std::size_t>(v)];
    };
    for (const Node* n : buckets)
      for (const auto* list : {&n->inputs, &n->outputs})
        for (std::size_t i = 0; i + 1 < list->size(); ++i) {
          const ValueId a = (*list)[i], b = (*list)[i + 1];
          INFO(p.train.value(a).name << " then " << p.train.value(b).name);
          const std::size_t end = address(a) + bytes[static_cast<std::size_t>(a)];
          CHECK(address(b) == (end + 255) / 256 * 256);  // the next one at the next 256-byte boundary
          CHECK(request.buffer_of_value[static_cast<std::size_t>(a)] ==
                request.buffer_of_value[static_cast<std::size_t>(b)]);
        }
    // A bucket's span is live from its first gradient to its join: no buffer live beside it shares its bytes.
    for (std::size_t a = 0; a < memory.buffers.size(); ++a)
      for (std::size_t b = a + 1; b < memory.buffers.size(); ++b) {
        const auto &x = memory.buffers[a], &y = memory.buffers[b];
        if (x.first > y.last || y.first > x.last) continue;
        const ArenaSlot &sx = memory.slots[a], &sy = memory.slots[b];
        CHECK_FALSE((sx.offset < sy.offset + sy.bytes && sy.offset < sx.offset + sx.bytes));
      }
  }
}

// backend.update_per_bucket: the update stage splits where the gradients' buckets differ, each launch after its
// own bucket's join on the step's stream, in the order the buckets' all-reduces come; off, one launch.
TEST_CASE("data parallel: update_per_bucket gives each bucket its own update launch, after its own all-reduce") {
  for (const int variant : {0, 1, 2, 3, 4}) {  // SGD, momentum, Adam, fp32 master weights with clipping, without
    INFO("variant " << variant);
    const MlpTraining t = variant_of(256, variant);  // per-layer buckets
    const TrainingProgram p = build_mlp_program(t, 60000, 10000, ProgramTarget::cuda);
    for (const bool per_bucket : {false, true}) {
      INFO("update_per_bucket " << per_bucket);
      const CheckedSchedule checked = checked_schedule(p.train, per_bucket);
      const Schedule& s = checked.lowered.schedule;
      const cuda::StreamPlan& plan = checked.plan;
      std::vector<std::size_t> reduces, updates;
      for (std::size_t i = 0; i < s.launches.size(); ++i) {
        const std::string name(s.launches[i].lowering->name());
        if (name == "nccl_all_reduce") reduces.push_back(i);
        if (name == "sgd_multi_tensor" || name == "update_multi_tensor") updates.push_back(i);
      }
      REQUIRE(reduces.size() == t.mlp.layers.size() - 1);
      const bool clipped = variant == 3;  // every update reads the clip scale, which reads every bucket
      if (!per_bucket || clipped) {
        std::string names;
        for (const auto& launch : s.launches) names += std::string(launch.lowering->name()) + " ";
        INFO(names);
        CHECK(updates.size() == 1u);
        continue;
      }
      REQUIRE(updates.size() == reduces.size());
      for (std::size_t k = 0; k < updates.size(); ++k) {
        // Launch k updates exactly the parameters of the k-th all-reduce's bucket, on the step's stream, after that
        // all-reduce's join and before the next one's.
        const Launch& u = s.launches[updates[k]];
        const std::size_t c = reduces[k];
        CHECK(plan.on_step_stream(updates[k]));
        CHECK(plan.join_before[c] <= updates[k]);
        if (k + 1 < updates.size()) CHECK(plan.join_before[reduces[k + 1]] > updates[k]);
        for (ValueId v : u.reads)
          if (p.train.value(v).producer >= 0 && p.train.node(p.train.value(v).producer).op == OpKind::all_reduce_mean)
            CHECK(p.train.value(v).producer == s.launches[c].nodes.front());
      }
    }
  }
}

// data_parallel.zero1 (OptimizerSpec::shard_updates): each sharded weight's gather is an nccl_all_gather launch on
// the communication stream, forked at the step's start and joined before the first launch that reads it; each
// sharded bucket an nccl_all_reduce launch; the updates of sharded gradients multi-tensor launches (they update
// the rank's range); and every two launches touching one value still run in order through the three streams.
TEST_CASE("data parallel: a zero1 rank gathers its sharded weights on the communication stream before they are read") {
  for (const int variant : {1, 2, 4}) {  // momentum, Adam, fp32 master weights reducing f16 gradients
    for (const std::int64_t bucket_bytes : {std::int64_t{0}, std::int64_t{25} << 20}) {
      for (const bool per_bucket : {false, true}) {
        INFO("variant " << variant << ", bucket_bytes " << bucket_bytes << ", update_per_bucket " << per_bucket);
        MlpTraining t = variant_of(256, variant);
        t.mlp.layers = {784, 1024, 1024, 10};  // W1 and W2 (1.5 and 2 MiB in f16) are sharded, W3 not
        t.optimizer.bucket_bytes = bucket_bytes;
        t.optimizer.shard_updates = true;
        t.optimizer.shard_min_bytes = 1 << 20;
        const TrainingProgram p = build_mlp_program(t, 60000, 10000, ProgramTarget::cuda);
        const CheckedSchedule checked = checked_schedule(p.train, per_bucket);
        const Schedule& s = checked.lowered.schedule;
        const cuda::StreamPlan& plan = checked.plan;
        std::size_t gathers = 0, sharded_gradients = 0;
        for (std::size_t i = 0; i < s.launches.size(); ++i) {
          const Launch& launch = s.launches[i];
          const std::string name(launch.lowering->name());
          for (NodeId id : launch.nodes) {
            const Node& n = p.train.node(id);
            if (n.op == OpKind::all_gather_shards) {
              ++gathers;
              CHECK(name == "nccl_all_gather");
              CHECK(plan.on_communication[i]);
              for (std::size_t j = 0; j < s.launches.size(); ++j)
                if (std::count(s.launches[j].reads.begin(), s.launches[j].reads.end(), n.outputs[0]) != 0)
                  CHECK(plan.join_before[i] <= j);
            }
            if (n.op == OpKind::all_reduce_mean && n.attr<AllReduceAttrs>().shards == 2) {
              sharded_gradients += n.inputs.size();  // (one joined bucket with bucket_bytes)
              CHECK(name == "nccl_all_reduce");
            }
            if (is_update_rule(n.op) && n.inputs.size() > 1 && gradient_shards(p.train, n.inputs[1]) > 1) {
              CHECK((name == "sgd_multi_tensor" || name == "update_multi_tensor"));
              for (ValueId copy : launch.carries)  // a rank updates a part: the whole compute copy stays a cast
                CHECK(p.train.node(p.train.value(copy).producer).inputs[0] != n.inputs[0]);
            }
          }
        }
        CHECK(gathers == 2);
        CHECK(sharded_gradients == 2);
      }
    }
  }
}
