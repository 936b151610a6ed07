// Core-only mode (issue 35) on the GPU: N training steps with the core
// lowerings alone (backend.core_only) and with the fast paths, from the same
// initial weights, give the same losses and final state within the dtype's
// tolerance (relative error by norm; a NaN fails): the report CNN (SGD with
// momentum, fp32 master weights), an MLP with Adam, and a bf16 MLP. The whole
// saved state (weights and optimizer state) is compared after the first step;
// after N steps the losses and weights: by then Adam's moments of near-zero
// gradients amplify rounding differences (an element's step is +-lr whatever
// its size), which the weights, moved by lr a step, do not show.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "models/mlp_program.hpp"
#include "models/sequential_program.hpp"
#include "runtime/core_only_switch.hpp"
#include "runtime/cuda/cuda_trainer.hpp"
#include "runtime/tensor_blob.hpp"
#include "tests/runtime/report_cnn.hpp"
#include "tests/runtime/test_support.hpp"
#include "tests/support/case_skips.hpp"
#include "tests/support/training_helpers.hpp"

using namespace sg;

namespace {

constexpr int kSteps = 12;

test::StepsRun train(TrainerSpec spec, const Dataset& data, bool core_only) {
  spec.backend.core_only = core_only;
  auto t = cuda::make_cuda_trainer(spec, data);
  return test::run_steps(*t, kSteps);
}

void check_same(const TrainerSpec& spec, const Dataset& data, double tolerance) {
  std::set<std::string> weights;
  for (ValueId id : spec.program.train.values_with_role(Role::param)) weights.insert(spec.program.train.value(id).name);
  const test::StepsRun fast = train(spec, data, false);
  const test::StepsRun core = train(spec, data, true);
  INFO("fast paths: " << fast.description);
  INFO("core only:  " << core.description);
  CHECK(test::relative_error(core.losses, fast.losses) < tolerance);
  test::check_saved_states_close(core.first_state, fast.first_state, tolerance);
  test::check_saved_states_close(core.state, fast.state, tolerance, weights);
  // The eval graphs too (the MLPs' at batch 32 take small_batch_forward with its folded fetch).
  CHECK(core.eval.examples == fast.eval.examples);
  CHECK(std::isfinite(fast.eval.loss));
  CHECK(std::abs(core.eval.loss - fast.eval.loss) <= tolerance * std::abs(core.eval.loss));
}

TrainerSpec mlp_spec(const Dataset& data, OptimizerKind optimizer, DType dtype) {
  MlpTraining m;
  m.mlp.layers = {96, 256, 256, 10};
  m.mlp.batch = 32;
  m.mlp.compute_dtype = dtype;
  m.mlp.weight_dtype = dtype;
  m.optimizer.kind = optimizer;
  m.optimizer.lr = optimizer == OptimizerKind::sgd ? 0.05 : 1e-3;
  // 32: the eval graph folds its fetch into small_batch_forward, whose x has
  // no buffer there (nothing after it reads x; writing it threw before issue 35).
  m.eval_batch = 32;
  m.init_seed = 35;
  TrainerSpec spec;
  spec.program = build_mlp_program(m, data.train.images.count, data.test.images.count, ProgramTarget::cuda);
  return spec;
}

}  // namespace

TEST_CASE("core-only training follows the fast paths: the report CNN with SGD") {
  if (core_only_forced_for_tests()) SG_SKIP_CASE("--core-only: both runs would be core-only");
  std::mt19937_64 rng(35);
  const Dataset data = test::random_dataset(64 * 8, 28 * 28, 10, rng);
  TrainerSpec spec;
  spec.program = build_sequential_program(test::report_cnn(), data.train.images.count, data.test.images.count,
                                          ProgramTarget::cuda);
  check_same(spec, data, 3e-2);  // fp16 activations, fp32 master weights
}

TEST_CASE("core-only training follows the fast paths: an MLP with Adam") {
  if (core_only_forced_for_tests()) SG_SKIP_CASE("--core-only: both runs would be core-only");
  std::mt19937_64 rng(36);
  const Dataset data = test::random_dataset(32 * 16, 96, 10, rng);
  check_same(mlp_spec(data, OptimizerKind::adam, DType::f16), data, 3e-2);  // fp16 weights and activations
}

TEST_CASE("core-only training follows the fast paths: a bf16 MLP") {
  if (core_only_forced_for_tests()) SG_SKIP_CASE("--core-only: both runs would be core-only");
  std::mt19937_64 rng(37);
  const Dataset data = test::random_dataset(32 * 16, 96, 10, rng);
  check_same(mlp_spec(data, OptimizerKind::sgd, DType::bf16), data, 6e-2);  // bf16: 8 mantissa bits
}
