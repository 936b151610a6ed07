// Weight gradients from every rank's rows on the CPU (issue 38,
// graph/gathered_gradients.hpp): the optimizer pass gathers a layer's input
// and output gradient over the ranks (all_gather_batch) where asked, those
// gradients need no all-reduce, and N simulated ranks
// (tests/runtime/simulated_ranks.hpp) end near the same ranks all-reducing
// and near one rank at batch N*B, for MLPs (SGD with momentum and clipping,
// Adam, fp32 master weights) and a model.sequential CNN.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "graph/verifier.hpp"
#include "models/mlp_program.hpp"
#include "models/sequential_program.hpp"
#include "tests/runtime/rank_cnn.hpp"
#include "tests/runtime/simulated_ranks.hpp"
#include "tests/runtime/test_support.hpp"

using namespace sg;
using namespace sg::test;

namespace {

MlpTraining small_mlp(std::int64_t batch, OptimizerKind kind, WeightGradients mode, bool master_weights = false) {
  MlpTraining t = rank_mlp({24, 40, 16, 5}, batch, kind, master_weights, 5);
  t.optimizer.weight_gradients = mode;
  return t;
}

TrainingProgram rank_program(MlpTraining t, std::int64_t rank, std::int64_t ranks, std::int64_t rows) {
  t.data_rank = rank;
  t.data_ranks = ranks;
  return build_mlp_program(t, rows, 10, ProgramTarget::cpu);
}

// The node computing each parameter's gradient as its update reads it (through casts).
std::vector<const Node*> gradient_nodes(const Graph& g) {
  std::vector<const Node*> out;
  for (const Node& n : g.nodes()) {
    if (!is_update_rule(n.op)) continue;
    const NodeId producer = gradient_producer(g, n.inputs[1]);
    REQUIRE(producer >= 0);
    out.push_back(&g.node(producer));
  }
  return out;
}

}  // namespace

TEST_CASE("weight gradients from every rank's rows: the optimizer pass gathers each layer's rows once") {
  for (const std::int64_t ranks : {2, 3}) {
    INFO(ranks << " ranks");
    const Graph g = rank_program(small_mlp(4, OptimizerKind::sgd, WeightGradients::gather), 1, ranks, 40).train;
    verify_graph(g);
    CHECK(nodes_of(g, OpKind::all_reduce_mean).empty());
    // X and dY of each of the 3 layers, dY shared by dW and db: 6 gathers.
    const auto gathers = nodes_of(g, OpKind::all_gather_batch);
    CHECK(gathers.size() == 6);
    std::set<ValueId> gathered;
    for (const Node* n : gathers) {
      CHECK(n->attr<AllReduceAttrs>().shards == ranks);
      CHECK(g.value(n->outputs[0]).shape[0] == 4 * ranks);
      CHECK(gathered.insert(n->outputs[0]).second);
    }
    const auto computed = gradient_nodes(g);
    CHECK(computed.size() == 6);
    for (const Node* n : computed)
      for (ValueId in : n->inputs) CHECK(gathered.count(in) == 1);
    // The chain still reads this rank's rows: every data gradient's matmul reads no gathered value.
    for (const Node& n : g.nodes())
      if (n.op == OpKind::matmul && !n.attr<MatmulAttrs>().trans_a)
        for (ValueId in : n.inputs) CHECK(gathered.count(in) == 0);
  }
}

TEST_CASE("weight gradients from every rank's rows: auto gathers where that costs less than the all-reduce") {
  // 256-4096-4096-10 (f16) at batch 16 on 2 ranks: the hidden layer's 33.5 MB of gradient against 0.26 MB of
  // rows in two calls: gathered; the first layer's 2 MB against 0.14 MB of rows but two calls (kCollectiveCallBytes
  // each) and the classifier's 82 KB: all-reduced.
  MlpTraining wide = small_mlp(16, OptimizerKind::sgd, WeightGradients::by_bytes);
  wide.mlp.layers = {256, 4096, 4096, 10};
  wide.mlp.compute_dtype = wide.mlp.weight_dtype = DType::f16;
  const Graph g = rank_program(wide, 0, 2, 400).train;
  verify_graph(g);
  CHECK(nodes_of(g, OpKind::all_gather_batch).size() == 2);
  CHECK(nodes_of(g, OpKind::all_reduce_mean).size() == 2);
  for (const Node* n : nodes_of(g, OpKind::all_gather_batch)) CHECK(g.value(n->inputs[0]).shape[1] == 4096);
  CHECK(gathering_pays({.gathered = 1 << 20, .gathers = 2, .reduced = 6 << 20}));
  CHECK_FALSE(gathering_pays({.gathered = 1 << 20, .gathers = 2, .reduced = 4 << 20}));
  // "reduce" never gathers; one rank has nothing to gather.
  const Graph reduce = rank_program(small_mlp(4, OptimizerKind::sgd, WeightGradients::reduce), 0, 2, 400).train;
  CHECK(nodes_of(reduce, OpKind::all_gather_batch).empty());
  const Graph one = rank_program(small_mlp(4, OptimizerKind::sgd, WeightGradients::gather), 0, 1, 400).train;
  CHECK(nodes_of(one, OpKind::all_gather_batch).empty());
  CHECK(weight_gradients_from_name("auto") == WeightGradients::by_bytes);
  CHECK(weight_gradients_name(WeightGradients::gather) == "gather");
  CHECK_THROWS_AS(weight_gradients_from_name("allgather"), std::invalid_argument);
}

TEST_CASE("weight gradients from every rank's rows: N simulated ranks end near the all-reducing ranks and 1 rank") {
  auto rng = test::fresh_rng();
  struct Case {
    OptimizerKind kind;
    bool master, clip;
    std::int64_t ranks;
  };
  for (const Case c : {Case{OptimizerKind::sgd, false, false, 2}, Case{OptimizerKind::sgd, false, true, 3},
                       Case{OptimizerKind::adam, false, false, 4}, Case{OptimizerKind::sgd, true, false, 2},
                       Case{OptimizerKind::adamw, true, false, 3}}) {
    const std::int64_t batch = 2 + std::int64_t(rng() % 5), steps = 6;
    INFO(optimizer_name(c.kind) << (c.master ? " with fp32 master weights" : "") << (c.clip ? " clipped" : "")
                                << ", " << c.ranks << " ranks x batch " << batch << ", seed " << test::last_seed());
    const std::int64_t rows = c.ranks * batch * 4 + 3;
    const Data d = random_dataset(rng, rows, 24, 5);
    auto spec = [&](std::int64_t b, WeightGradients mode) {
      MlpTraining t = small_mlp(b, c.kind, mode, c.master);
      if (c.clip) t.optimizer.clip_grad_norm = 0.05;
      return t;
    };
    std::vector<std::unique_ptr<CpuExecutor<float>>> gathering, reducing;
    for (std::int64_t r = 0; r < c.ranks; ++r) {
      gathering.push_back(executor(rank_program(spec(batch, WeightGradients::gather), r, c.ranks, rows), d));
      reducing.push_back(executor(rank_program(spec(batch, WeightGradients::reduce), r, c.ranks, rows), d));
    }
    REQUIRE(nodes_of(gathering.front()->graph(), OpKind::all_reduce_mean).empty());
    auto reference =
        executor(build_mlp_program(spec(c.ranks * batch, WeightGradients::reduce), rows, 10, ProgramTarget::cpu), d);
    const auto initial = all_params(*reference);
    for (std::int64_t s = 0; s < steps; ++s) {
      step_ranks(gathering);
      step_ranks(reducing);
      reference->run();
      // Every rank computes the same sums from the same rows: the same weights on every rank, bit for bit.
      for (std::int64_t r = 1; r < c.ranks; ++r) CHECK(all_params(*gathering[r]) == all_params(*gathering.front()));
    }
    const auto params = all_params(*gathering.front());
    CHECK(std::all_of(params.begin(), params.end(), [](float v) { return std::isfinite(v); }));
    // Only the summation order (and with f16 compute, where the gradient is rounded) differs.
    const double tolerance = c.master ? 1e-2 : 1e-4;
    CHECK(test::relative_error(params, all_params(*reducing.front())) < tolerance);
    CHECK(test::relative_error(params, all_params(*reference)) < tolerance);
    CHECK(test::relative_error(params, initial) > 1e-3);
  }
}

// A model.sequential CNN: a convolution's filter gradient and column sums read every rank's rows.
TEST_CASE("weight gradients from every rank's rows: a model.sequential CNN on 2 simulated ranks") {
  auto rng = test::fresh_rng();
  for (const RankCnnCase& c : rank_cnn_cases(rng)) {
    INFO(optimizer_name(c.kind) << ", batch " << c.batch << ", seed " << test::last_seed());
    const auto ranks_with = [&](WeightGradients mode) {
      return c.executors([mode](SequentialTraining& t) { t.optimizer.weight_gradients = mode; });
    };
    auto gathering = ranks_with(WeightGradients::gather), reducing = ranks_with(WeightGradients::reduce);
    const Graph& g = gathering.front()->graph();
    verify_graph(g);
    // The second convolution gathers; the first (its input a view of the batch) and the linear layer (a
    // flatten's rows) stay all-reduced: both kinds in one step.
    CHECK(!nodes_of(g, OpKind::all_reduce_mean).empty());
    CHECK(!nodes_of(g, OpKind::all_gather_batch).empty());
    bool filter_gathered = false;
    for (const Node* n : gradient_nodes(g))
      if (n->op == OpKind::conv2d_backward_filter)
        filter_gathered = filter_gathered || g.node(g.value(n->inputs[1]).producer).op == OpKind::all_gather_batch;
    CHECK(filter_gathered);
    const auto initial = all_params(*reducing.front());
    for (int s = 0; s < 5; ++s) {
      step_ranks(gathering);
      step_ranks(reducing);
    }
    const auto params = all_params(*gathering.front());
    CHECK(params == all_params(*gathering.back()));
    CHECK(test::relative_error(params, all_params(*reducing.front())) < 1e-4);
    CHECK(test::relative_error(params, initial) > 1e-3);
  }
}
