#pragma once
// The AdamW MLP trainer setup the GPU optimizer tests share (test_optimizers,
// test_carried_copies_gpu, test_update_apart_gpu): lr 2e-3, weight decay
// 0.01, fixed initial values and shuffle.
#include <cstdint>
#include <utility>
#include <vector>

#include "tests/support/training_helpers.hpp"

namespace sg::test {

inline MlpTrainerSpec adamw_spec(std::vector<std::int64_t> layers, std::int64_t batch, DType weights, double clip) {
  MlpTrainerSpec spec;
  spec.mlp.layers = std::move(layers);
  spec.mlp.batch = batch;
  spec.mlp.weight_dtype = weights;
  spec.optimizer.lr = 2e-3;
  spec.optimizer.kind = OptimizerKind::adamw;
  spec.optimizer.weight_decay = 0.01;
  spec.optimizer.clip_grad_norm = clip;
  spec.eval_batch = 100;
  spec.init_seed = 3;
  spec.shuffle_seed = 5;
  return spec;
}

}  // namespace sg::test
