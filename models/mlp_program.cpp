#include "models/mlp_program.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace sg {

std::int64_t eval_batch_for(std::int64_t rows, std::int64_t wanted) {
  for (std::int64_t b = std::min(rows, wanted); b > 1; --b)
    if (rows % b == 0) return b;
  return 1;
}

MlpSpec mlp_for_target(MlpSpec mlp, ProgramTarget target) {
  if (target == ProgramTarget::cuda && !is_half_width_float(mlp.compute_dtype)) mlp.compute_dtype = DType::f16;
  return mlp;
}

void check_data_rank(std::int64_t rank, std::int64_t ranks) {
  if (rank < 0 || rank >= ranks)
    throw GraphError(fmt::format("data parallel: rank {} is not in 0..{}", rank, ranks - 1));
}

std::uint64_t rank_dropout_seed(std::uint64_t seed, std::int64_t rank) {
  // Philox keys differing by an odd multiple of the golden ratio: unrelated streams.
  return seed + static_cast<std::uint64_t>(rank) * 0x9E3779B97F4A7C15ull;
}

TrainingProgram build_mlp_program(const MlpTraining& t, std::int64_t train_rows, std::int64_t test_rows,
                                  ProgramTarget target) {
  TrainingProgram p;
  MlpSpec train = mlp_for_target(t.mlp, target);
  train.dataset_rows = train_rows;
  OptimizerSpec sgd = t.optimizer;
  if (t.data_ranks > 0) shard_for_rank(train, sgd, t.data_rank, t.data_ranks);
  p.train = build_training_stages(train, sgd, t.fusion).fused;
  p.train_data = mlp_data_bindings(p.train, train.batch);
  p.train_data.ranks = std::max<std::int64_t>(1, t.data_ranks);

  MlpSpec eval = mlp_for_target(t.mlp, target);
  eval.dataset_rows = test_rows;
  eval.batch = eval_batch_for(test_rows, t.eval_batch);
  p.eval = build_mlp_eval(eval);
  fuse(p.eval, t.fusion);
  p.eval_data = mlp_data_bindings(p.eval, eval.batch);

  p.init = mlp_initial_parameters(t.mlp.layers, t.init_seed);
  p.learning_rate = t.optimizer.lr;
  return p;
}

}  // namespace sg
