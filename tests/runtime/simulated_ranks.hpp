#pragma once
// Several data-parallel ranks simulated on the CPU (issues 25, 38): one CPU
// executor per rank runs every node of its rank's graph, and the nodes that
// communicate are done on the host across the executors:
// - all_reduce_mean: the mean of each input over the ranks (their sum where
//   the inputs are pre-scaled: AllReduceAttrs), written to every rank's
//   output (an f16/bf16 one rounded to its dtype, as NCCL's reduction in
//   that dtype returns it);
// - a sharded one (ZeRO-1, AllReduceAttrs::shards): the same value in each
//   rank's own range only, NaN in the others', so that anything that reads
//   beyond its range (an update over the whole parameter, a forward read of a
//   parameter not gathered) shows in the weights and the loss;
// - all_gather_shards: each range of the output from the rank that owns it
//   (that rank's input);
// - all_gather_batch: rank r's rows at block r of every rank's output.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "models/mlp_program.hpp"
#include "runtime/cpu/cpu_executor.hpp"
#include "runtime/training_program.hpp"

namespace sg::test {

// A small MLP for simulated ranks: the given layer widths, f32 weights (with
// `master_weights` f16 compute and tanh, test_data_parallel.cpp's
// small_master_mlp says why), SGD with momentum at lr 0.2 or another rule at
// 0.01, weight decay 0.01.
inline MlpTraining rank_mlp(std::vector<std::int64_t> layers, std::int64_t batch, OptimizerKind kind,
                            bool master_weights, std::uint64_t init_seed) {
  MlpTraining t;
  t.mlp.layers = std::move(layers);
  t.mlp.batch = batch;
  t.mlp.compute_dtype = master_weights ? DType::f16 : DType::f32;
  t.mlp.weight_dtype = DType::f32;
  if (master_weights) t.mlp.activation = MlpActivation::tanh;
  t.optimizer.lr = kind == OptimizerKind::sgd ? 0.2 : 0.01;
  t.optimizer.kind = kind;
  t.optimizer.momentum = kind == OptimizerKind::sgd ? 0.9 : 0.0;
  t.optimizer.weight_decay = 0.01;
  t.eval_batch = 10;
  t.init_seed = init_seed;
  return t;
}

// The nodes of one op, in graph order.
inline std::vector<const Node*> nodes_of(const Graph& g, OpKind op) {
  std::vector<const Node*> out;
  for (const Node& n : g.nodes())
    if (n.op == op) out.push_back(&n);
  return out;
}

struct Data {
  std::int64_t rows = 0;
  std::vector<std::uint8_t> images, labels;
  std::vector<std::int32_t> perm;
};

inline Data random_dataset(std::mt19937_64& rng, std::int64_t rows, std::int64_t features, std::int64_t classes) {
  Data d;
  d.rows = rows;
  d.images.resize(static_cast<std::size_t>(rows * features));
  d.labels.resize(static_cast<std::size_t>(rows));
  for (auto& v : d.images) v = static_cast<std::uint8_t>(rng() % 256);
  for (auto& v : d.labels) v = static_cast<std::uint8_t>(rng() % static_cast<std::uint64_t>(classes));
  d.perm.resize(static_cast<std::size_t>(rows));
  std::iota(d.perm.begin(), d.perm.end(), 0);
  std::shuffle(d.perm.begin(), d.perm.end(), rng);
  return d;
}

inline std::unique_ptr<CpuExecutor<float>> executor(const TrainingProgram& p, const Data& d) {
  auto e = std::make_unique<CpuExecutor<float>>(p.train);
  e->tensor(p.train_data.images).u8 = d.images;
  e->tensor(p.train_data.labels).u8 = d.labels;
  e->tensor(p.train_data.perm).i32 = d.perm;
  for (const auto& init : p.init) e->tensor(init.name).real = init.values;
  e->set_learning_rate(p.learning_rate);
  return e;
}

// Rank `rank`'s range [begin, end) of `size` elements cut into `shards`.
inline std::pair<std::size_t, std::size_t> shard_range(std::size_t size, std::int64_t shards, std::size_t rank) {
  const std::size_t count = size / static_cast<std::size_t>(shards);
  return {rank * count, (rank + 1) * count};
}

// One training step of every rank, node by node (the header says how the
// communicating nodes are simulated).
inline void step_ranks(std::vector<std::unique_ptr<CpuExecutor<float>>>& ranks) {
  const Graph& g = ranks.front()->graph();
  for (const Node& n : g.nodes()) {
    if (n.op == OpKind::all_gather_shards) {
      const std::int64_t shards = n.attr<AllReduceAttrs>().shards;
      REQUIRE(shards == static_cast<std::int64_t>(ranks.size()));
      for (auto& r : ranks) {
        auto& out = r->tensor(n.outputs[0]).real;
        for (std::size_t owner = 0; owner < ranks.size(); ++owner) {
          const auto& in = ranks[owner]->tensor(n.inputs[0]).real;
          const auto [begin, end] = shard_range(out.size(), shards, owner);
          std::copy(in.begin() + static_cast<std::ptrdiff_t>(begin), in.begin() + static_cast<std::ptrdiff_t>(end),
                    out.begin() + static_cast<std::ptrdiff_t>(begin));
        }
      }
      continue;
    }
    if (n.op == OpKind::all_gather_batch) {
      REQUIRE(n.attr<AllReduceAttrs>().shards == static_cast<std::int64_t>(ranks.size()));
      for (auto& r : ranks) {
        auto& out = r->tensor(n.outputs[0]).real;
        for (std::size_t from = 0; from < ranks.size(); ++from) {
          const auto& in = ranks[from]->tensor(n.inputs[0]).real;
          REQUIRE(in.size() * ranks.size() == out.size());
          std::copy(in.begin(), in.end(), out.begin() + static_cast<std::ptrdiff_t>(from * in.size()));
        }
      }
      continue;
    }
    if (n.op != OpKind::all_reduce_mean) {
      for (auto& r : ranks) r->run_node(r->graph().node(n.id));
      continue;
    }
    const auto& attrs = n.attr<AllReduceAttrs>();
    const double divisor = attrs.pre_scaled ? 1.0 : double(ranks.size());
    for (std::size_t i = 0; i < n.inputs.size(); ++i) {
      std::vector<double> sum(ranks.front()->tensor(n.inputs[i]).real.size(), 0.0);
      for (auto& r : ranks) {
        const auto& in = r->tensor(n.inputs[i]).real;
        for (std::size_t k = 0; k < in.size(); ++k) sum[k] += in[k];
      }
      for (std::size_t rank = 0; rank < ranks.size(); ++rank) {
        auto& out = ranks[rank]->tensor(n.outputs[i]).real;
        auto [begin, end] = std::pair<std::size_t, std::size_t>{0, out.size()};
        if (attrs.shards > 1) std::tie(begin, end) = shard_range(out.size(), attrs.shards, rank);
        for (std::size_t k = 0; k < out.size(); ++k)
          out[k] = k >= begin && k < end ? static_cast<float>(sum[k] / divisor)
                                         : std::numeric_limits<float>::quiet_NaN();
        ranks[rank]->round_to_dtype(n.outputs[i]);
      }
    }
  }
}

// Every parameter of `e`, concatenated in graph order.
inline std::vector<float> all_params(CpuExecutor<float>& e) {
  std::vector<float> out;
  for (ValueId p : e.graph().values_with_role(Role::param)) {
    const auto& v = e.tensor(p).real;
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

}  // namespace sg::test
