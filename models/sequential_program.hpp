#pragma once
// A Sequential training setup (models/sequential.hpp) turned into the
// TrainingProgram the runtime runs, as build_mlp_program does for the MLP.
#include <cstdint>

#include "graph/fusion_pass.hpp"
#include "graph/optimizer_pass.hpp"
#include "models/mlp_program.hpp"
#include "models/sequential.hpp"
#include "runtime/training_program.hpp"

namespace sg {

struct SequentialTraining {
  SequentialSpec model;  // dataset_rows is set per split by build_sequential_program
  OptimizerSpec optimizer;
  FusionOptions fusion;
  std::int64_t eval_batch = 1000;  // rounded down to a divisor of the test rows
  std::uint64_t init_seed = 0;
  // Data parallel, as in MlpTraining: rank `data_rank` of `data_ranks` (0: a
  // single-process run) fetches its slice and reduces every gradient.
  std::int64_t data_rank = 0;
  std::int64_t data_ranks = 0;
};

// The spec with `target`'s compute dtype (as mlp_for_target).
SequentialSpec sequential_for_target(SequentialSpec spec, ProgramTarget target);

// Training graph over `train_rows` rows, eval graph (fused too) over
// `test_rows` rows, eval_batch_for(test_rows, eval_batch) per run; for the
// CUDA target f32 compute becomes f16 as in mlp_for_target. Throws GraphError
// when the spec is unusable.
TrainingProgram build_sequential_program(const SequentialTraining& training, std::int64_t train_rows,
                                         std::int64_t test_rows, ProgramTarget target);

}  // namespace sg
