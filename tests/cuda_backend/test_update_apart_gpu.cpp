// BackendOptions::large_updates_apart on the GPU: a large parameter's update
// in a launch of its own, beside the last weight gradients, gives the bits of
// the one update launch (same rule, same step read), by graph replay, stream
// launches and K steps per graph, and the steps follow the CPU backend.
#include <doctest/doctest.h>

#include <algorithm>

#include "runtime/cuda/cuda_program.hpp"
#include "runtime/cuda/cuda_trainer.hpp"
#include "tests/cuda_backend/adamw_spec.hpp"
#include "tests/cuda_backend/launch_paths_check.hpp"
#include "tests/runtime/test_support.hpp"
#include "tests/support/training_helpers.hpp"

using namespace sg;

namespace {

// W2 [1000, 1500] (an fp32 master with Adam's moments: 42 MB an update, over large_updates_apart's
// 32), its gradient before W1's; batch 160 keeps the weights' updates out of the gradient tiles
// (wgrad_update: batch <= 128).
sg::test::MlpTrainerSpec spec_with_large_w2(bool apart) {
  auto spec = sg::test::adamw_spec({64, 1500, 1000, 10}, 160, DType::f32, 0.0);
  spec.optimizer.lr = 1e-3;
  spec.backend.large_updates_apart = apart;
  return spec;
}

std::size_t launches_apart(const cuda::CudaTrainer& t) {
  const auto& p = t.training_program();
  const auto& ls = p.schedule().launches;
  return static_cast<std::size_t>(std::count_if(ls.begin(), ls.end(), [&](const Launch& l) {
    return l.lowering->describe(p.graph(), l).find(",apart") != std::string::npos;
  }));
}

}  // namespace

TEST_CASE("a large update apart gives the bits of one update launch, on every launch path, and follows the CPU") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  const Dataset data = sg::test::random_dataset(800, 64, 10, rng);
  cuda::CudaTrainer apart(sg::test::cuda_spec(spec_with_large_w2(true), data), data);
  cuda::CudaTrainer together(sg::test::cuda_spec(spec_with_large_w2(false), data), data);
  CHECK(launches_apart(apart) == 1);
  CHECK(launches_apart(together) == 0);
  auto cpu = make_cpu_trainer(sg::test::cpu_spec(spec_with_large_w2(true), data), data);
  const auto gl = sg::test::losses(apart, 30);
  together.train(30);
  sg::test::check_same_state(apart, together);
  const auto cl = sg::test::losses(*cpu, 30);
  MESSAGE("loss step 30 gpu " << gl.back() << " cpu " << cl.back());
  CHECK(sg::test::relative_error(gl, cl) < 2e-2);
  sg::test::check_launch_paths_agree(spec_with_large_w2(true), data, 21, 4,
                                     [](cuda::CudaTrainer& replay) { CHECK(launches_apart(replay) == 1); });
}
