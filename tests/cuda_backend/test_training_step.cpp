// The whole CUDA training step against the CPU backend: same initial weights,
// same batches. Graph replay vs stream launches, K steps per graph, resume,
// fused vs unfused, learning-rate changes without re-capture.
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>

#include "ops/cuda/fast_paths/one_pass_backward/dgrad_wgrad_kernels.hpp"
#include "runtime/cuda/cuda_program.hpp"
#include "runtime/cuda/cuda_trainer.hpp"
#include "runtime/data/idx_reader.hpp"
#include "runtime/tensor_blob.hpp"
#include "tests/runtime/test_support.hpp"
#include "tests/support/test_data.hpp"
#include "tests/cuda_backend/launch_paths_check.hpp"
#include "tests/cuda_backend/learning_rate_check.hpp"
#include "tests/support/training_helpers.hpp"
#include "tests/support/case_skips.hpp"
#include "tests/support/core_only_skips.hpp"

using namespace sg;
using sg::test::all_parameters;
using sg::test::cpu_spec;
using sg::test::cuda_spec;
using sg::test::losses;
using sg::test::MlpTrainerSpec;
using sg::test::random_dataset;

namespace {

MlpTrainerSpec odd_spec(DType weights, double momentum) {
  MlpTrainerSpec spec;
  spec.mlp.layers = {37, 129, 65, 11};
  spec.mlp.batch = 33;
  spec.mlp.weight_dtype = weights;
  spec.optimizer = {0.05, momentum, momentum > 0 ? 1e-3 : 0.0};
  spec.eval_batch = 100;
  spec.init_seed = 3;
  spec.shuffle_seed = 5;
  return spec;  // widths 37/129/65 are not multiples of 16: always the per-group schedule
}

}  // namespace

TEST_CASE("100 CUDA training steps follow the CPU backend's loss curve") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  const Dataset data = random_dataset(400, 37, 11, rng);  // 12 batches per epoch: reshuffles happen
  for (auto [weights, momentum] : std::vector<std::pair<DType, double>>{{DType::f32, 0.0}, {DType::f32, 0.9}, {DType::f16, 0.9}}) {
    INFO("weights " << dtype_name(weights) << " momentum " << momentum);
    const MlpTrainerSpec spec = odd_spec(weights, momentum);
    auto cpu = make_cpu_trainer(cpu_spec(spec, data), data);
    cuda::CudaTrainer gpu(cuda_spec(spec, data), data);
    CHECK(sg::test::relative_error(all_parameters(gpu), all_parameters(*cpu)) < 1e-3);  // same initial weights
    gpu.poison_activations();
    // One step: every parameter matches the CPU closely (fp16 activations only).
    const auto gpu_losses_first = losses(gpu, 1);
    const auto cpu_losses_first = losses(*cpu, 1);
    CHECK(sg::test::relative_error(all_parameters(gpu), all_parameters(*cpu)) < 2e-3);
    auto gpu_losses = losses(gpu, 99);
    auto cpu_losses = losses(*cpu, 99);
    gpu_losses.insert(gpu_losses.begin(), gpu_losses_first[0]);
    cpu_losses.insert(cpu_losses.begin(), cpu_losses_first[0]);
    MESSAGE("loss step 1 gpu " << gpu_losses[0] << " cpu " << cpu_losses[0] << ", step 100 gpu " << gpu_losses[99]
                               << " cpu " << cpu_losses[99]);
    CHECK(sg::test::relative_error(gpu_losses, cpu_losses) < 1e-2);
    // After 100 steps fp16 rounding of activations and gradients has compounded
    // (momentum 0.9 amplifies it tenfold); the loss curve above is the contract.
    CHECK(sg::test::relative_error(all_parameters(gpu), all_parameters(*cpu)) < 5e-2);
    // It learns something, even from noise (400 rows seen 8 times): the mean
    // loss of the last 10 steps is below that of the first 10.
    CHECK(std::accumulate(gpu_losses.end() - 10, gpu_losses.end(), 0.0) <
          std::accumulate(gpu_losses.begin(), gpu_losses.begin() + 10, 0.0));
    const EvalResult ge = gpu.evaluate(), ce = cpu->evaluate();
    CHECK(ge.examples == ce.examples);
    CHECK(std::abs(ge.loss - ce.loss) / ce.loss < 1e-2);
  }
}

TEST_CASE("graph replay, stream launches and K steps per graph give bit-identical parameters") {
  auto rng = sg::test::fresh_rng();
  const Dataset data = random_dataset(400, 37, 11, rng);
  sg::test::check_launch_paths_agree(odd_spec(DType::f16, 0.9), data, 57, 5, [](cuda::CudaTrainer& replay) {
    CHECK(replay.cuda_graph_nodes() >= replay.training_program().schedule().launches.size());
  });
}

TEST_CASE("with our forwards, the folded fetch and the folded first-layer update, K steps per graph are K replays") {
  SG_SKIP_IF_CORE_ONLY("our one-pass and small-batch kernels");
  auto rng = sg::test::fresh_rng();
  const Dataset data = random_dataset(400, 784, 10, rng);
  MlpTrainerSpec spec;
  spec.mlp.layers = {784, 128, 128, 10};
  spec.mlp.batch = 32;
  spec.mlp.weight_dtype = DType::f16;
  spec.optimizer = {0.1, 0.0, 0.0};
  spec.backend.whole_step = false;
  spec.shuffle_seed = 5;
  // (each step's first launch reads the first layer's weight that the previous step's last launch wrote)
  sg::test::check_launch_paths_agree(spec, data, 40, 8, [](cuda::CudaTrainer& replay) {
    const auto& launches = replay.training_program().schedule().launches;
    // layer 1's forward with the fetch, layer 2's, the classifier, the output layer's backward, layer 2's
    // one pass with layer 1's bias and weight updates
    const auto& g = replay.training_program().graph();
    CHECK(launches.size() == 5);
    CHECK(launches.front().lowering->describe(g, launches.front()).find("+batch fetch") != std::string::npos);
    CHECK(launches.back().lowering->describe(g, launches.back()).find("+first layer's weight update") !=
          std::string::npos);
  });
}

TEST_CASE("resume on the GPU is bit-exact: 120 steps == 60 + save + load + 60") {
  auto rng = sg::test::fresh_rng();
  const Dataset data = random_dataset(400, 37, 11, rng);
  const MlpTrainerSpec spec = odd_spec(DType::f16, 0.9);
  const TrainerSpec gpu_spec = cuda_spec(spec, data);
  cuda::CudaTrainer straight(gpu_spec, data), first(gpu_spec, data), second(gpu_spec, data);
  straight.train(120);
  first.train(60);
  second.load_state(first.save_state());
  second.train(60);
  sg::test::check_same_state(straight, second);
}

TEST_CASE("the unfused schedule follows the fused one within fp16 tolerance") {
  auto rng = sg::test::fresh_rng();
  const Dataset data = random_dataset(400, 37, 11, rng);
  MlpTrainerSpec spec = odd_spec(DType::f32, 0.0);
  cuda::CudaTrainer fused(cuda_spec(spec, data), data);
  spec.fusion = FusionOptions{false, false, false, true};
  cuda::CudaTrainer unfused(cuda_spec(spec, data), data);
  CHECK(unfused.training_program().schedule().launches.size() > fused.training_program().schedule().launches.size());
  CHECK(sg::test::relative_error(losses(fused, 60), losses(unfused, 60)) < 1e-2);
}

TEST_CASE("a learning-rate change reaches the replayed graph") {
  auto rng = sg::test::fresh_rng();
  sg::test::check_learning_rate_changes_reach(odd_spec(DType::f32, 0.0), random_dataset(400, 37, 11, rng), false);
}

TEST_CASE("the reference network trains on real MNIST through CUDA graph replay") {
  const Dataset data{data::load_split(sg::test::mnist_dir_or_skip(), "train"),
                     data::load_split(sg::test::mnist_dir_or_skip(), "t10k")};
  MlpTrainerSpec spec;
  spec.mlp.layers = {784, 128, 128, 128, 10};
  spec.mlp.batch = 32;
  spec.mlp.weight_dtype = DType::f16;
  spec.optimizer = {0.05, 0.0, 0.0};
  spec.backend.whole_step = false;  // the per-group schedule (test_whole_step covers the one-kernel step)
  spec.backend.one_pass_backward = false;  // with its two-pass cuBLASLt backward: 17 launches
  cuda::CudaTrainer t(cuda_spec(spec, data), data);
  if (!sg::core_only_forced_for_tests())  // (core-only: the plain kernels, more launches)
    CHECK(t.training_program().schedule().launches.size() == 17);  // the step advance rides on a bias update
  t.train(5000);
  const double loss = t.last_loss();
  const EvalResult eval = t.evaluate();
  MESSAGE("after 5000 replays: loss " << loss << ", test accuracy " << eval.accuracy << ", CUDA graph nodes "
                                      << t.cuda_graph_nodes());
  CHECK(std::isfinite(loss));
  CHECK(eval.accuracy > 0.95);
}

TEST_CASE("one-pass dgrad + SGD and the fused output layer follow the unfused backward on real MNIST") {
  SG_SKIP_IF_CORE_ONLY("our one-pass and small-batch kernels");
  const Dataset data{data::load_split(sg::test::mnist_dir_or_skip(), "train", 4000),
                     data::load_split(sg::test::mnist_dir_or_skip(), "t10k", 500)};
  // width 1024: the hidden layer's 1024 x 1024 W is shared by clusters of 2 blocks per column strip
  for (const std::int64_t width : {256, 1024}) {
  INFO("width " << width);
  MlpTrainerSpec spec;
  spec.mlp.layers = {784, width, width, 10};
  spec.mlp.batch = 32;
  spec.mlp.weight_dtype = DType::f16;
  spec.optimizer = {0.1, 0.0, 1e-4};
  spec.backend.whole_step = false;  // the per-group schedule, where the one-pass launch lives
  cuda::CudaTrainer one_pass(cuda_spec(spec, data), data);
  spec.backend.one_pass_backward = false;
  cuda::CudaTrainer two_pass(cuda_spec(spec, data), data);
  const auto& launches = one_pass.training_program().schedule().launches;
  const auto& g = one_pass.training_program().graph();
  const auto count = [&](std::string_view lowering) {
    return std::count_if(launches.begin(), launches.end(), [&](const Launch& l) { return l.lowering->name() == lowering; });
  };
  CHECK(count("one_pass_strips") == 1);  // layer 2 (layer 1 has no dgrad)
  CHECK(count("output_layer_backward") == 1);  // layer 3 (10 classes) with softmax-xent
  CHECK(count("batch_fetch") == 0);  // folded into layer 1's forward
  CHECK(launches.front().lowering->describe(g, launches.front()).find("+batch fetch") != std::string::npos);
  // layer 1's weight update rides on layer 2's one-pass launch
  CHECK(launches.back().lowering->describe(g, launches.back()).find("+first layer's weight update") !=
        std::string::npos);
  // one launch fewer for the merged pair, one for layer 1's bias update it also does, four for the
  // output layer (softmax-xent, b3, the dgrad, w3, b2: one launch), one for the batch fetch, one for
  // layer 1's weight update
  CHECK(launches.size() + 8 == two_pass.training_program().schedule().launches.size());
  one_pass.poison_activations();
  const auto a = losses(one_pass, 200), b = losses(two_pass, 200);
  MESSAGE("width " << width << ": step 200 loss one-pass " << a.back() << " two-pass " << b.back());
  CHECK(sg::test::relative_error(a, b) < 1e-2);
  CHECK(sg::test::relative_error(all_parameters(one_pass), all_parameters(two_pass)) < 2e-2);
  const auto mean20 = [](auto first) { return std::accumulate(first, first + 20, 0.0) / 20; };
  CHECK(mean20(a.end() - 20) < 0.85 * mean20(a.begin()));
  }
}

TEST_CASE("batch 256: the one-pass wgmma backward follows the two-pass cuBLASLt backward on real MNIST") {
  SG_SKIP_IF_CORE_ONLY("our one-pass and small-batch kernels");
  if (const std::string why = cuda::one_pass::wgmma_unsupported(256, 8192, 8192); !why.empty()) {
    SG_SKIP_CASE(why);
  }
  const Dataset data{data::load_split(sg::test::mnist_dir_or_skip(), "train", 4096),
                     data::load_split(sg::test::mnist_dir_or_skip(), "t10k", 500)};
  // ReLU; silu (the backward reads the pre-activation); tanh (it reads the output)
  for (const MlpActivation activation : {MlpActivation::relu, MlpActivation::silu, MlpActivation::tanh}) {
  INFO(activation_name(activation));
  MlpTrainerSpec spec;
  spec.mlp.activation = activation;
  spec.mlp.layers = {784, 8192, 8192, 10};  // layer 2's 8192 x 8192 W takes the wgmma kernel
  spec.mlp.batch = 256;
  spec.mlp.weight_dtype = DType::f16;
  spec.optimizer = {0.05, 0.0, 1e-4};
  spec.backend.whole_step = false;
  cuda::CudaTrainer one_pass(cuda_spec(spec, data), data);
  spec.backend.one_pass_backward = false;
  cuda::CudaTrainer two_pass(cuda_spec(spec, data), data);
  const auto& launches = one_pass.training_program().schedule().launches;
  const auto merged = std::count_if(launches.begin(), launches.end(),
                                    [](const Launch& l) { return l.lowering->name() == "one_pass_wgmma"; });
  CHECK(merged == 1);
  CHECK(launches.size() < two_pass.training_program().schedule().launches.size());
  one_pass.poison_activations();
  const auto a = losses(one_pass, 100), b = losses(two_pass, 100);
  MESSAGE(activation_name(activation) << ": step 100 loss one-pass " << a.back() << " two-pass " << b.back());
  CHECK(sg::test::relative_error(a, b) < 1e-2);
  CHECK(sg::test::relative_error(all_parameters(one_pass), all_parameters(two_pass)) < 2e-2);
  const auto mean10 = [](auto first) { return std::accumulate(first, first + 10, 0.0) / 10; };
  CHECK(mean10(a.end() - 10) < 0.85 * mean10(a.begin()));
  }
}
