#pragma once
// The model.sequential CNN the simulated-rank tests train (test_zero_sharding.cpp,
// test_gathered_gradients.cpp): 1x8x8 inputs, two 3x3 convolutions (8 and 16
// filters), a max-pool and a 6-way classifier, f32, rank `rank` of `ranks`
// at `batch` rows each; and the two cases (SGD, AdamW) of its 2 simulated
// ranks as CPU executors.
#include <memory>
#include <vector>

#include "models/sequential_program.hpp"
#include "tests/runtime/layer_specs.hpp"
#include "tests/runtime/simulated_ranks.hpp"

namespace sg::test {

inline SequentialTraining rank_cnn(OptimizerKind kind, std::int64_t batch, std::int64_t rank, std::int64_t ranks) {
  SequentialTraining t;
  t.model.input_shape = {1, 8, 8};
  t.model.layers = {net_layer(LayerKind::conv2d, 8, 3, 1), net_layer(LayerKind::activation),
                    net_layer(LayerKind::conv2d, 16, 3, 1), net_layer(LayerKind::activation),
                    net_layer(LayerKind::max_pool2d, 0, 2), net_layer(LayerKind::flatten),
                    net_layer(LayerKind::linear, 6)};
  t.model.batch = batch;
  t.model.compute_dtype = DType::f32;
  t.model.weight_dtype = DType::f32;
  t.optimizer.lr = kind == OptimizerKind::sgd ? 0.05 : 0.01;
  t.optimizer.kind = kind;
  t.optimizer.momentum = kind == OptimizerKind::sgd ? 0.9 : 0.0;
  t.data_rank = rank;
  t.data_ranks = ranks;
  t.eval_batch = 10;
  t.init_seed = 3;
  return t;
}

// One run of the CNN on 2 simulated ranks: SGD with momentum or AdamW, a
// random batch of 2-5 rows a rank, three batches of data and one row more.
struct RankCnnCase {
  OptimizerKind kind = OptimizerKind::sgd;
  std::int64_t ranks = 2, batch = 0, rows = 0;
  Data data;

  // The case's ranks, each built after `configure(SequentialTraining&)` set the option the test compares.
  template <class Configure>
  std::vector<std::unique_ptr<CpuExecutor<float>>> executors(Configure configure) const {
    std::vector<std::unique_ptr<CpuExecutor<float>>> out;
    for (std::int64_t r = 0; r < ranks; ++r) {
      SequentialTraining t = rank_cnn(kind, batch, r, ranks);
      configure(t);
      out.push_back(executor(build_sequential_program(t, rows, 10, ProgramTarget::cpu), data));
    }
    return out;
  }
};

inline std::vector<RankCnnCase> rank_cnn_cases(std::mt19937_64& rng) {
  std::vector<RankCnnCase> cases;
  for (const OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::adamw}) {
    RankCnnCase c;
    c.kind = kind;
    c.batch = 2 + std::int64_t(rng() % 4);
    c.rows = c.ranks * c.batch * 3 + 1;
    c.data = random_dataset(rng, c.rows, 64, 6);
    cases.push_back(std::move(c));
  }
  return cases;
}

}  // namespace sg::test
