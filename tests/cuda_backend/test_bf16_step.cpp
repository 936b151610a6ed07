// bf16 compute end to end: the CUDA training step (cuBLASLt CUDA_R_16BF and
// the generic kernels' bf16 instantiations) against the CPU backend, which
// rounds every bf16 value as the GPU stores it; resume; real MNIST.
//
// Tolerances: bf16 has 8 significant bits to fp16's 11, so one rounding is
// 8x coarser; the CPU rounds the same values at the same points, and what
// remains is f32 summation order (cuBLASLt vs the CPU's loops) flipping a
// bf16 rounding now and then. Bounds are the fp16 tests' (test_training_step)
// times 4 over a shorter run (20 steps, not 100), so a dtype mix-up (O(1)
// errors) or an unwritten buffer (NaN) cannot pass.
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>

#include "runtime/cuda/cuda_program.hpp"
#include "runtime/cuda/cuda_trainer.hpp"
#include "runtime/data/idx_reader.hpp"
#include "runtime/tensor_blob.hpp"
#include "tests/runtime/test_support.hpp"
#include "tests/support/test_data.hpp"
#include "tests/support/training_helpers.hpp"

using namespace sg;
using sg::test::all_parameters;
using sg::test::cpu_spec;
using sg::test::cuda_spec;
using sg::test::losses;
using sg::test::MlpTrainerSpec;
using sg::test::random_dataset;

namespace {

MlpTrainerSpec bf16_spec(std::vector<std::int64_t> layers, std::int64_t batch, DType weights, double momentum) {
  MlpTrainerSpec spec;
  spec.mlp.layers = std::move(layers);
  spec.mlp.batch = batch;
  spec.mlp.compute_dtype = DType::bf16;
  spec.mlp.weight_dtype = weights;
  spec.optimizer = {0.05, momentum, momentum > 0 ? 1e-3 : 0.0};
  spec.eval_batch = 100;
  spec.init_seed = 3;
  spec.shuffle_seed = 5;
  return spec;
}

const std::vector<std::string> kGeneric = {"batch_fetch", "cublaslt_matmul", "softmax_xent", "bias_grad_sgd",
                                           "cast_params", "elementwise"};

}  // namespace

TEST_CASE("bf16: 20 CUDA training steps follow the CPU backend (odd widths and the fast paths' shapes)") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  // {37, 129, 65, 11} at batch 33: odd everything. {784, 128, 128, 10} at
  // batch 32: in fp16 the fused small-batch / one-pass / whole-step kernels
  // take this one; in bf16 they must step aside.
  for (const auto& [layers, batch] : std::vector<std::pair<std::vector<std::int64_t>, std::int64_t>>{
           {{37, 129, 65, 11}, 33}, {{784, 128, 128, 10}, 32}})
    for (auto [weights, momentum] : std::vector<std::pair<DType, double>>{
             {DType::f32, 0.0}, {DType::f32, 0.9}, {DType::bf16, 0.0}, {DType::bf16, 0.9}}) {
      INFO("layers " << layers.size() << " first " << layers.front() << " weights " << dtype_name(weights)
                     << " momentum " << momentum);
      const Dataset data = random_dataset(400, layers.front(), layers.back(), rng);
      const MlpTrainerSpec spec = bf16_spec(layers, batch, weights, momentum);
      auto cpu = make_cpu_trainer(cpu_spec(spec, data), data);
      cuda::CudaTrainer gpu(cuda_spec(spec, data), data);
      const auto& g = gpu.training_program().graph();
      for (const Launch& l : gpu.training_program().schedule().launches) {
        INFO("launch " << l.lowering->name());
        CHECK(std::find(kGeneric.begin(), kGeneric.end(), std::string(l.lowering->name())) != kGeneric.end());
      }
      int bf16_values = 0;
      for (const Value& v : g.values()) bf16_values += v.dtype == DType::bf16;
      CHECK(bf16_values > 0);
      // Same initial weights, bit for bit: both round to nearest even.
      CHECK(all_parameters(gpu) == all_parameters(*cpu));
      gpu.poison_activations();
      const auto gpu_first = losses(gpu, 1), cpu_first = losses(*cpu, 1);
      CHECK(std::abs(gpu_first[0] - cpu_first[0]) / cpu_first[0] < 4e-3);
      CHECK(sg::test::relative_error(all_parameters(gpu), all_parameters(*cpu)) < 8e-3);
      const auto gpu_losses = losses(gpu, 19), cpu_losses = losses(*cpu, 19);
      MESSAGE("step 20 loss gpu " << gpu_losses.back() << " cpu " << cpu_losses.back());
      CHECK(sg::test::relative_error(gpu_losses, cpu_losses) < 4e-2);
      CHECK(sg::test::relative_error(all_parameters(gpu), all_parameters(*cpu)) < 1e-1);
      const EvalResult ge = gpu.evaluate(), ce = cpu->evaluate();
      CHECK(ge.examples == ce.examples);
      CHECK(std::abs(ge.loss - ce.loss) / ce.loss < 4e-2);
    }
}

TEST_CASE("bf16: resume on the GPU is bit-exact, and the checkpoint holds bf16 weights") {
  auto rng = sg::test::fresh_rng();
  const Dataset data = random_dataset(400, 37, 11, rng);
  const TrainerSpec gpu_spec = cuda_spec(bf16_spec({37, 129, 65, 11}, 33, DType::bf16, 0.9), data);
  cuda::CudaTrainer straight(gpu_spec, data), first(gpu_spec, data), second(gpu_spec, data);
  straight.train(80);
  first.train(40);
  const auto state = first.save_state();
  int bf16_blobs = 0;
  for (const auto& blob : state) bf16_blobs += blob.dtype == DType::bf16;
  CHECK(bf16_blobs == 6 + 6);  // 3 weights and 3 biases, and their velocities
  second.load_state(state);
  second.train(40);
  sg::test::check_same_state(straight, second);
}

TEST_CASE("bf16: the default-style MLP learns real MNIST") {
  const Dataset data{data::load_split(sg::test::mnist_dir_or_skip(), "train"),
                     data::load_split(sg::test::mnist_dir_or_skip(), "t10k")};
  MlpTrainerSpec spec = bf16_spec({784, 1024, 1024, 10}, 128, DType::f32, 0.9);
  spec.optimizer = {0.05, 0.9, 1e-4};
  spec.eval_batch = 1000;
  cuda::CudaTrainer t(cuda_spec(spec, data), data);
  t.train(2000);  // about 4 epochs at a constant learning rate
  const EvalResult eval = t.evaluate();
  MESSAGE("bf16 784-1024-1024-10 after 2000 steps: loss " << t.last_loss() << ", test accuracy " << eval.accuracy);
  CHECK(std::isfinite(t.last_loss()));
  CHECK(eval.accuracy > 0.96);  // (constant lr, no input normalisation: the config run is the 98% check)
}
