// Data-parallel training on the CPU (issue 25): the sharded batch fetch
// covers every sample of an epoch exactly once across the ranks; the
// optimizer pass puts one all_reduce_mean bucket per layer between the
// gradients and their updates; and N simulated ranks (N CPU executors whose
// all_reduce_mean nodes are done on the host across them,
// tests/runtime/simulated_ranks.hpp) end with the weights of one rank at
// batch N*B.
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "graph/verifier.hpp"
#include "models/mlp_program.hpp"
#include "models/sequential_program.hpp"
#include "tests/runtime/small_residual_cnn.hpp"
#include "runtime/cpu/cpu_executor.hpp"
#include "runtime/trainer.hpp"
#include "tests/runtime/simulated_ranks.hpp"
#include "tests/runtime/test_support.hpp"

using namespace sg;
using namespace sg::test;

namespace {

// The rows of one rank's batch at `step`, through a graph's batch_indices node and the CPU executor.
std::vector<std::int32_t> batch_rows(const std::vector<std::int32_t>& perm, std::int64_t batch, std::int64_t rank,
                                     std::int64_t ranks, std::int32_t step) {
  Graph g;
  const auto n = static_cast<std::int64_t>(perm.size());
  const ValueId p = g.input("perm", {n}, DType::i32);
  const ValueId s = g.state("step", {1}, DType::i32);
  const ValueId idx = g.batch_indices(p, s, batch, rank, ranks);
  g.mark_output(idx);
  CpuExecutor<float> exec(g);
  exec.tensor(p).i32 = perm;
  exec.tensor(s).i32 = {step};
  exec.run();
  return exec.tensor(idx).i32;
}

MlpTraining small_mlp(std::int64_t batch, OptimizerKind kind) {
  MlpTraining t;
  t.mlp.layers = {24, 16, 12, 6};
  t.mlp.batch = batch;
  t.mlp.compute_dtype = DType::f32;
  t.mlp.weight_dtype = DType::f32;
  t.optimizer.lr = kind == OptimizerKind::sgd ? 0.2 : 0.01;
  t.optimizer.kind = kind;
  t.optimizer.momentum = kind == OptimizerKind::sgd ? 0.9 : 0.0;
  t.optimizer.clip_grad_norm = kind == OptimizerKind::sgd ? 0.5 : 0.0;  // the clip norm is over the reduced gradients
  t.eval_batch = 10;
  t.init_seed = 7;
  return t;
}

// The small MLP in f16 with fp32 master weights (the casts whose place precision.all_reduce picks).
// tanh, not ReLU: two f16 computations of the same step (one rank at N*B, N
// ranks) differ in their last bits, and with ReLU a hidden unit whose input
// sits near 0 can be on in one and off in the other, which moves the weights
// by up to 1e-2 by norm within 6 steps (3 of 40 random runs, whichever way
// the gradients are reduced). A smooth activation keeps the comparison to
// rounding.
MlpTraining small_master_mlp(std::int64_t batch, bool reduce_in_compute_dtype) {
  MlpTraining t = small_mlp(batch, OptimizerKind::sgd);
  t.mlp.activation = MlpActivation::tanh;
  t.mlp.compute_dtype = DType::f16;
  t.optimizer.reduce_in_compute_dtype = reduce_in_compute_dtype;
  return t;
}

// `steps` steps of one rank at N*B and of N simulated ranks: the ranks hold
// one copy of the weights between them, which ends near the reference's and
// away from where it started.
void check_ranks_follow(CpuExecutor<float>& reference, std::vector<std::unique_ptr<CpuExecutor<float>>>& ranks,
                        std::int64_t steps, OptimizerKind kind, double tolerance = 0) {
  const auto initial = all_params(reference);
  for (std::int64_t s = 0; s < steps; ++s) {
    reference.run();
    step_ranks(ranks);
    for (std::size_t r = 1; r < ranks.size(); ++r) CHECK(all_params(*ranks[r]) == all_params(*ranks[0]));
  }
  // Only the summation order differs (a mean of per-rank means vs one mean
  // over N*B rows): f32 rounding. SGD (momentum, clipping) stays near 1e-7
  // by norm (1e-5 asked); Adam divides by sqrt(v) + eps, so a gradient
  // element near zero turns rounding into a visible step (seen up to 1.4e-5
  // in thousands of random runs; 1e-3 asked).
  const double err = test::relative_error(all_params(*ranks[0]), all_params(reference));
  INFO("relative error by norm " << err);
  CHECK(err < (tolerance > 0 ? tolerance : kind == OptimizerKind::sgd ? 1e-5 : 1e-3));
  CHECK(test::relative_error(all_params(*ranks[0]), initial) > 1e-3);  // the training really moved them
}

// The executors of ranks 0..n_ranks-1 of the MLP `training(batch)` describes, on the data d.
template <class Training>
std::vector<std::unique_ptr<CpuExecutor<float>>> rank_executors(Training training, std::int64_t n_ranks,
                                                                std::int64_t batch, std::int64_t rows, const Data& d) {
  std::vector<std::unique_ptr<CpuExecutor<float>>> ranks;
  for (std::int64_t r = 0; r < n_ranks; ++r) {
    MlpTraining t = training(batch);
    t.data_rank = r;
    t.data_ranks = n_ranks;
    ranks.push_back(executor(build_mlp_program(t, rows, 10, ProgramTarget::cpu), d));
  }
  return ranks;
}

}  // namespace

TEST_CASE("data parallel: the ranks' batch slices cover every sample of an epoch exactly once") {
  auto rng = test::fresh_rng();
  for (int trial = 0; trial < 20; ++trial) {
    const std::int64_t ranks = 1 + std::int64_t(rng() % 5), batch = 1 + std::int64_t(rng() % 9);
    const std::int64_t rows = ranks * batch + std::int64_t(rng() % 200);
    INFO("rows " << rows << ", batch " << batch << " x " << ranks << " ranks, seed " << test::last_seed());
    std::vector<std::int32_t> perm(static_cast<std::size_t>(rows));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    const std::int64_t steps = rows / (ranks * batch);
    std::multiset<std::int32_t> seen;
    for (std::int32_t step = 0; step < steps; ++step) {
      std::vector<std::int32_t> global;
      for (std::int64_t r = 0; r < ranks; ++r) {
        const auto slice = batch_rows(perm, batch, r, ranks, step);
        REQUIRE(slice.size() == std::size_t(batch));
        seen.insert(slice.begin(), slice.end());
        global.insert(global.end(), slice.begin(), slice.end());
      }
      // The ranks' slices, in rank order, are one rank's batch of ranks * batch rows.
      CHECK(global == batch_rows(perm, ranks * batch, 0, 1, step));
    }
    CHECK(seen.size() == std::size_t(steps * ranks * batch));
    CHECK(std::set<std::int32_t>(seen.begin(), seen.end()).size() == seen.size());  // none twice
    // Exactly the epoch's rows: the permutation minus its tail of rows mod (ranks * batch).
    const std::multiset<std::int32_t> epoch(perm.begin(), perm.begin() + steps * ranks * batch);
    CHECK(seen == epoch);
    // The next epoch's first step starts over at the permutation's head.
    CHECK(batch_rows(perm, batch, 0, ranks, static_cast<std::int32_t>(steps)) == batch_rows(perm, batch, 0, ranks, 0));
  }
}

TEST_CASE("data parallel: a rank's batch_indices outside its world is refused by the shape rule") {
  Graph g;
  const ValueId p = g.input("perm", {10}, DType::i32);
  const ValueId s = g.state("step", {1}, DType::i32);
  CHECK_THROWS_WITH_AS(g.batch_indices(p, s, 4, 2, 2), doctest::Contains("rank 2 of 2 ranks"), GraphError);
  CHECK_THROWS_WITH_AS(g.batch_indices(p, s, 4, 0, 3), doctest::Contains("global batch 4 x 3 ranks"), GraphError);
}

TEST_CASE("data parallel: one all_reduce_mean per layer sits between every gradient and its update") {
  for (const OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::adam}) {
    auto t = small_mlp(8, kind);
    t.data_rank = 1;
    t.data_ranks = 2;
    const TrainingProgram p = build_mlp_program(t, 100, 20, ProgramTarget::cpu);
    const Graph& g = p.train;
    verify_graph(g);
    CHECK(p.train_data.ranks == 2);
    std::size_t buckets = 0;
    std::set<ValueId> reduced;
    for (const Node& n : g.nodes()) {
      if (n.op == OpKind::batch_indices) {
        CHECK(n.attr<BatchIndicesAttrs>().rank == 1);
        CHECK(n.attr<BatchIndicesAttrs>().ranks == 2);
      }
      // Two ranks: the loss gradient is each rank's share of the global mean, so every bucket is a sum.
      if (n.op == OpKind::softmax_xent_backward) CHECK(n.attr<LossGradientAttrs>().scale == 0.5);
      if (n.op != OpKind::all_reduce_mean) continue;
      ++buckets;
      CHECK(n.attr<AllReduceAttrs>().pre_scaled);
      CHECK(n.inputs.size() == 2);  // a layer: its weight and its bias gradient
      reduced.insert(n.outputs.begin(), n.outputs.end());
    }
    CHECK(buckets == t.mlp.layers.size() - 1);
    // Every update (directly, or through its clip scaling) reads a reduced gradient; nothing else reads a raw one.
    for (const Node& n : g.nodes()) {
      if (n.op != OpKind::sgd_update && n.op != OpKind::adam_update) continue;
      ValueId grad = n.inputs[1];
      if (g.value(grad).producer >= 0 && g.node(g.value(grad).producer).op == OpKind::scale_grad)
        grad = g.node(g.value(grad).producer).inputs[0];
      CHECK(reduced.count(grad) == 1);
    }
    // The fused weight updates read no gradient buffer, so they cannot take a reduced one.
    for (const auto& group : g.fusion_groups()) {
      CHECK(group.kind != FusionKind::wgrad_sgd);
      CHECK(group.kind != FusionKind::bgrad_sgd);
    }
    // The eval graph is every rank's whole test batch: no shard, no collective.
    for (const Node& n : p.eval.nodes()) {
      CHECK(n.op != OpKind::all_reduce_mean);
      if (n.op == OpKind::batch_indices) CHECK(n.attr<BatchIndicesAttrs>().ranks == 1);
    }
  }
  // A single-process program has neither, and its loss gradient is the mean's.
  const TrainingProgram single = build_mlp_program(small_mlp(8, OptimizerKind::sgd), 100, 20, ProgramTarget::cpu);
  for (const Node& n : single.train.nodes()) {
    CHECK(n.op != OpKind::all_reduce_mean);
    if (n.op == OpKind::softmax_xent_backward) CHECK(n.attr<LossGradientAttrs>().scale == 1.0);
  }
  CHECK(single.train_data.ranks == 1);
  // A world of one rank reduces (a copy) without pre-scaling.
  auto one = small_mlp(8, OptimizerKind::sgd);
  one.data_ranks = 1;
  const TrainingProgram world_of_one = build_mlp_program(one, 100, 20, ProgramTarget::cpu);
  for (const Node& n : world_of_one.train.nodes()) {
    if (n.op == OpKind::all_reduce_mean) CHECK_FALSE(n.attr<AllReduceAttrs>().pre_scaled);
    if (n.op == OpKind::softmax_xent_backward) CHECK(n.attr<LossGradientAttrs>().scale == 1.0);
  }
}

TEST_CASE("data parallel: N simulated ranks at batch B end with the weights of one rank at batch N*B") {
  auto rng = test::fresh_rng();
  for (const OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::adam}) {
    for (const std::int64_t n_ranks : {2, 3, 4}) {
      const std::int64_t batch = 2 + std::int64_t(rng() % 6), steps = 6;
      INFO(optimizer_name(kind) << ", " << n_ranks << " ranks x batch " << batch << ", seed " << test::last_seed());
      const std::int64_t rows = n_ranks * batch * 4 + 3;  // 4 global batches a epoch, a tail
      const Data d = random_dataset(rng, rows, 24, 6);
      const auto reference_program = build_mlp_program(small_mlp(n_ranks * batch, kind), rows, 10, ProgramTarget::cpu);
      auto reference = executor(reference_program, d);
      auto ranks = rank_executors([&](std::int64_t b) { return small_mlp(b, kind); }, n_ranks, batch, rows, d);
      check_ranks_follow(*reference, ranks, steps, kind);
    }
  }
}

TEST_CASE("data parallel: bucket_bytes joins the layers' buckets in the order their gradients complete") {
  // 24-16-12-6 in f32: the layers' gradients are 1600, 816 and 312 bytes, complete from the last layer back.
  const auto buckets = [](std::int64_t bucket_bytes) {
    auto t = small_mlp(8, OptimizerKind::sgd);
    t.data_rank = 1;
    t.data_ranks = 2;
    t.optimizer.bucket_bytes = bucket_bytes;
    const TrainingProgram p = build_mlp_program(t, 100, 20, ProgramTarget::cpu);
    verify_graph(p.train);
    std::vector<std::size_t> sizes;  // the inputs of each all_reduce_mean, in graph order
    for (const Node& n : p.train.nodes()) {
      if (n.op != OpKind::all_reduce_mean) continue;
      sizes.push_back(n.inputs.size());
      for (ValueId in : n.inputs) CHECK(p.train.value(in).producer < n.id);  // after its last gradient
    }
    return sizes;
  };
  CHECK(buckets(0) == std::vector<std::size_t>{2, 2, 2});  // one per layer
  CHECK(buckets(1) == std::vector<std::size_t>{2, 2, 2});  // every layer already holds a byte
  CHECK(buckets(1000) == std::vector<std::size_t>{4, 2});  // 312 + 816 >= 1000, then the first layer
  CHECK(buckets(std::int64_t{1} << 30) == std::vector<std::size_t>{6});

  // The means are per tensor whatever the bucket: simulated ranks end with the same bits.
  auto rng = test::fresh_rng();
  const std::int64_t batch = 4, rows = 2 * batch * 4 + 3;
  const Data d = random_dataset(rng, rows, 24, 6);
  const auto trained = [&](std::int64_t bucket_bytes) {
    auto ranks = rank_executors(
        [&](std::int64_t b) {
          auto t = small_mlp(b, OptimizerKind::sgd);
          t.optimizer.bucket_bytes = bucket_bytes;
          return t;
        },
        2, batch, rows, d);
    for (int s = 0; s < 4; ++s) step_ranks(ranks);
    return all_params(*ranks[0]);
  };
  CHECK(trained(0) == trained(std::int64_t{1} << 30));
}

TEST_CASE("data parallel: precision.all_reduce compute reduces fp32 master weights' gradients in f16, before the casts") {
  for (const bool compute : {false, true}) {
    INFO("reduce in the compute dtype " << compute);
    auto t = small_master_mlp(8, compute);
    t.data_rank = 0;
    t.data_ranks = 2;
    const Graph g = build_mlp_program(t, 100, 20, ProgramTarget::cpu).train;
    verify_graph(g);
    std::size_t buckets = 0;
    for (const Node& n : g.nodes()) {
      if (n.op != OpKind::all_reduce_mean) continue;
      ++buckets;
      for (ValueId in : n.inputs) CHECK(g.value(in).dtype == (compute ? DType::f16 : DType::f32));
      for (ValueId out : n.outputs) {  // compute: each mean widened by its cast (moved after the bucket), then used
        const auto readers = g.consumers(out);
        if (!compute) {  // the clip scale and the scaling read the f32 means
          for (NodeId r : readers) CHECK(g.node(r).op != OpKind::cast);
          continue;
        }
        REQUIRE(readers.size() == 1);
        const Node& cast = g.node(readers[0]);
        CHECK(cast.op == OpKind::cast);
        CHECK(g.value(cast.outputs[0]).dtype == DType::f32);
      }
    }
    CHECK(buckets == t.mlp.layers.size() - 1);
  }
  // Without casts (f32 compute) the option changes nothing.
  auto plain = small_mlp(8, OptimizerKind::sgd), flagged = plain;
  plain.data_ranks = flagged.data_ranks = 2;
  flagged.optimizer.reduce_in_compute_dtype = true;
  CHECK(build_mlp_program(plain, 100, 20, ProgramTarget::cpu).train ==
        build_mlp_program(flagged, 100, 20, ProgramTarget::cpu).train);
}

TEST_CASE("data parallel: ranks reducing f16 gradients follow one rank at N*B within f16 rounding") {
  auto rng = test::fresh_rng();
  for (const std::int64_t n_ranks : {2, 3}) {
    const std::int64_t batch = 2 + std::int64_t(rng() % 6), steps = 6;
    INFO(n_ranks << " ranks x batch " << batch << ", seed " << test::last_seed());
    const std::int64_t rows = n_ranks * batch * 4 + 3;
    const Data d = random_dataset(rng, rows, 24, 6);
    auto reference = executor(build_mlp_program(small_master_mlp(n_ranks * batch, true), rows, 10, ProgramTarget::cpu), d);
    auto ranks = rank_executors([](std::int64_t b) { return small_master_mlp(b, true); }, n_ranks, batch, rows, d);
    // Each rank's f16 gradient and their f16 mean round twice where one rank at N*B rounds once
    // (f16's 2^-11 per gradient element); over 6 steps about 1e-4 of the weights by norm (at most
    // 1.7e-4 in 600 random runs), against 2-4e-8 with f32 gradients and f32 compute (the test above).
    check_ranks_follow(*reference, ranks, steps, OptimizerKind::sgd, 1e-3);
  }
}

TEST_CASE("data parallel: a model.sequential CNN (a residual add) on N simulated ranks matches one rank at N*B") {
  auto rng = test::fresh_rng();
  for (const OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::adamw}) {
    const std::int64_t n_ranks = 2 + std::int64_t(rng() % 3), batch = 2 + std::int64_t(rng() % 4), steps = 5;
    INFO(optimizer_name(kind) << ", " << n_ranks << " ranks x batch " << batch << ", seed " << test::last_seed());
    const std::int64_t rows = n_ranks * batch * 3 + 1;
    const Data d = random_dataset(rng, rows, 36, 6);
    auto reference = executor(build_sequential_program(test::small_residual_cnn(n_ranks * batch, kind), rows, 10, ProgramTarget::cpu), d);
    std::vector<std::unique_ptr<CpuExecutor<float>>> ranks;
    for (std::int64_t r = 0; r < n_ranks; ++r) {
      auto t = test::small_residual_cnn(batch, kind);
      t.data_rank = r;
      t.data_ranks = n_ranks;
      const TrainingProgram p = build_sequential_program(t, rows, 10, ProgramTarget::cpu);
      CHECK(p.train_data.ranks == n_ranks);
      std::size_t buckets = 0;
      for (const Node& n : p.train.nodes()) buckets += n.op == OpKind::all_reduce_mean;
      CHECK(buckets == 3);  // each conv and the linear layer: its weight and bias gradient
      ranks.push_back(executor(p, d));
    }
    check_ranks_follow(*reference, ranks, steps, kind);
  }
}

TEST_CASE("data parallel: every rank draws its own dropout masks, rank 0 those of a single process") {
  const auto seeds_of = [](const Graph& g) {
    std::vector<std::uint64_t> seeds;
    for (const Node& n : g.nodes())
      if (n.op == OpKind::dropout) seeds.push_back(n.attr<DropoutAttrs>().seed);
    return seeds;
  };
  const auto program = [](std::int64_t rank, std::int64_t ranks) {
    auto t = small_mlp(4, OptimizerKind::sgd);
    t.mlp.dropout = 0.3;
    t.mlp.dropout_seed = 11;
    t.data_rank = rank;
    t.data_ranks = ranks;
    return build_mlp_program(t, 40, 10, ProgramTarget::cpu).train;
  };
  const auto single = seeds_of(program(0, 0)), rank0 = seeds_of(program(0, 3)), rank1 = seeds_of(program(1, 3)),
             rank2 = seeds_of(program(2, 3));
  REQUIRE(!single.empty());
  CHECK(rank0 == single);
  CHECK(rank1.size() == single.size());
  for (std::size_t i = 0; i < single.size(); ++i) {
    CHECK(rank1[i] != single[i]);
    CHECK(rank2[i] != rank1[i]);
  }
}

TEST_CASE("data parallel: the CPU trainer refuses a program sharded over several ranks") {
  auto t = small_mlp(4, OptimizerKind::sgd);
  t.data_rank = 0;
  t.data_ranks = 2;
  TrainerSpec spec;
  spec.program = build_mlp_program(t, 40, 10, ProgramTarget::cpu);
  Dataset data;
  data.train.images.count = 40;
  data.test.images.count = 10;
  CHECK_THROWS_WITH(make_cpu_trainer(spec, data), doctest::Contains("needs the CUDA backend with NCCL"));
}
