#pragma once
// An MLP training setup turned into the TrainingProgram the runtime runs:
// the fused training step, the eval graph, the initial parameters, the data
// bindings and the learning rate, for the rows of the dataset's splits and
// the backend that will run it.
#include <cstdint>

#include "graph/fusion_pass.hpp"
#include "graph/optimizer_pass.hpp"
#include "models/mlp.hpp"
#include "runtime/training_program.hpp"

namespace sg {

struct MlpTraining {
  MlpSpec mlp;  // dataset_rows is set per split by build_mlp_program
  OptimizerSpec optimizer;
  FusionOptions fusion;
  std::int64_t eval_batch = 1000;  // rounded down to a divisor of the test rows
  std::uint64_t init_seed = 0;
  // issue 25 (data parallel): this process is rank `data_rank` of
  // `data_ranks` (0: a single-process run). The training graph then fetches
  // the rank's slice of each global batch (mlp.batch rows per rank) and
  // reduces every gradient over the ranks (all_reduce_mean) before its update;
  // the eval graph is the same on every rank.
  std::int64_t data_rank = 0;
  std::int64_t data_ranks = 0;
};

// Which backend the graphs are built for. The CUDA backend runs f16
// activations only, so its graphs use compute dtype f16 whatever the spec
// says; the CPU reference runs the spec as given.
enum class ProgramTarget : std::uint8_t { cpu, cuda };

// Largest divisor of `rows` not above `wanted` (eval batches cover the test set exactly).
std::int64_t eval_batch_for(std::int64_t rows, std::int64_t wanted);

// The MLP with `target`'s compute dtype (the spec itself for the CPU; the
// CUDA backend computes in f16 or bf16, so f32 compute becomes f16 there).
MlpSpec mlp_for_target(MlpSpec mlp, ProgramTarget target);

// Throws GraphError for a rank outside 0..ranks-1.
void check_data_rank(std::int64_t rank, std::int64_t ranks);

// The dropout seed of rank `rank`: rank 0 keeps `seed`, every other rank gets
// its own stream, so that the ranks' masks (keyed on the element's place in
// the rank's own batch) are not the same pattern N times over.
std::uint64_t rank_dropout_seed(std::uint64_t seed, std::int64_t rank);

// The training graph's spec (MlpSpec or SequentialSpec) and optimizer for
// rank `rank` of `ranks` (issue 25): the rank's slice of each global batch,
// its own dropout stream, every gradient reduced over the ranks (the loss
// gradient pre-scaled by 1/ranks, each bucket a sum). Throws
// GraphError for a rank outside 0..ranks-1.
template <class ModelSpec>
void shard_for_rank(ModelSpec& spec, OptimizerSpec& optimizer, std::int64_t rank, std::int64_t ranks) {
  check_data_rank(rank, ranks);
  spec.batch_rank = rank;
  spec.batch_ranks = ranks;
  spec.dropout_seed = rank_dropout_seed(spec.dropout_seed, rank);
  optimizer.all_reduce_gradients = true;
  optimizer.pre_scale_ranks = ranks;
}

// Training graph over `train_rows` rows, eval graph (fused too) over
// `test_rows` with eval_batch_for(test_rows, eval_batch) rows per run.
// Throws GraphError when the spec is unusable.
TrainingProgram build_mlp_program(const MlpTraining& training, std::int64_t train_rows, std::int64_t test_rows,
                                  ProgramTarget target);

}  // namespace sg
