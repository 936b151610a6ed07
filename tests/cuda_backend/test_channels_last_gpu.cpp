// Channels-last convolution layers (graph/channels_last_pass.hpp) on the GPU:
// N training steps of the channels-last program and of the NCHW one, from
// the same initial weights on the same batches, give the same losses and
// weights within fp16's tolerance (relative error by norm; a NaN fails),
// with SGD (momentum: the conv biases' column sums fused with their update)
// and AdamW (the sums widened to the fp32 master biases); small 3-channel
// images with overlapping poolings and a stride-2 conv, and MNIST-sized
// 1-channel images with 32 and 64 channels (the packed pooling paths), and
// a residual CNN with batch_norm on MNIST-sized images (channels-last: the
// batch_norm rows path over [N*H*W, C], and the global pooling). The
// trainer says which layout it ran and the schedule shows the lowerings.
#include <doctest/doctest.h>

#include <random>
#include <set>
#include <string>
#include <vector>

#include "models/sequential_program.hpp"
#include "runtime/cuda/cuda_program.hpp"
#include "runtime/cuda/cuda_trainer.hpp"
#include "runtime/trainer.hpp"
#include "runtime/tensor_blob.hpp"
#include "tests/runtime/channels_last_networks.hpp"
#include "tests/runtime/test_support.hpp"
#include "tests/support/core_only_skips.hpp"
#include "tests/support/training_helpers.hpp"

using namespace sg;

namespace {

constexpr int kSteps = 8;

SequentialTraining small_images(OptimizerKind kind) {
  SequentialTraining t;
  t.model.input_shape = {3, 11, 11};
  const LayerSpec gelu = test::activation_layer(MlpActivation::gelu);
  t.model.layers = {test::net_layer(LayerKind::conv2d, 6, 3, 1),
                    test::net_layer(LayerKind::activation),
                    test::net_layer(LayerKind::max_pool2d, 0, 3, 0, 2),
                    test::net_layer(LayerKind::conv2d, 12, 3, 1, 2),
                    gelu,
                    test::net_layer(LayerKind::max_pool2d, 0, 2, 0, 1),
                    test::net_layer(LayerKind::flatten),
                    test::net_layer(LayerKind::linear, 10)};
  t.model.batch = 24;
  t.model.weight_dtype = DType::f32;
  t.optimizer.kind = kind;
  t.optimizer.lr = kind == OptimizerKind::sgd ? 0.05 : 2e-3;
  t.optimizer.momentum = kind == OptimizerKind::sgd ? 0.9 : 0.0;
  t.optimizer.weight_decay = kind == OptimizerKind::adamw ? 0.01 : 0.0;
  t.eval_batch = 40;
  t.init_seed = 9;
  return t;
}

SequentialTraining mnist_sized(OptimizerKind kind) {
  SequentialTraining t = small_images(kind);
  t.model.input_shape = {1, 28, 28};
  t.model.layers = test::two_conv_layers();
  t.model.batch = 32;
  return t;
}

SequentialTraining batch_norm_residual(OptimizerKind kind) {
  SequentialTraining t = small_images(kind);
  t.model.input_shape = {1, 28, 28};
  t.model.layers = test::batch_norm_residual_layers(8);  // 16 x 28 x 28 = 12544 rows of 8 channels
  t.model.batch = 16;
  t.optimizer.lr = kind == OptimizerKind::sgd ? 0.01 : 1e-3;
  return t;
}

test::StepsRun train(const SequentialTraining& t, const Dataset& data, ActivationLayout layout) {
  TrainerSpec spec;
  spec.program = build_sequential_program(t, data.train.images.count, data.test.images.count, ProgramTarget::cuda);
  spec.backend.activation_layout = layout;
  auto trainer = cuda::make_cuda_trainer(spec, data);
  return test::run_steps(*trainer, kSteps);
}

// The channels-last GPU trainer of `t` with `kernels` running its convolutions, and its CPU twin.
std::unique_ptr<Trainer> channels_last_trainer(const SequentialTraining& t, const Dataset& data,
                                               ConvKernels kernels = ConvKernels::automatic) {
  TrainerSpec spec;
  spec.program = build_sequential_program(t, data.train.images.count, data.test.images.count, ProgramTarget::cuda);
  spec.backend.activation_layout = ActivationLayout::channels_last;
  spec.backend.conv_kernels = kernels;
  return cuda::make_cuda_trainer(spec, data);
}
std::unique_ptr<Trainer> cpu_trainer(const SequentialTraining& t, const Dataset& data) {
  TrainerSpec spec;
  spec.program = build_sequential_program(t, data.train.images.count, data.test.images.count, ProgramTarget::cpu);
  return make_cpu_trainer(spec, data);
}

// A GPU trainer's training step as lowered.
const cuda::CudaProgram& program_of(const Trainer& gpu) {
  return dynamic_cast<const cuda::CudaTrainer&>(gpu).training_program();
}

// Launches of lowering `name` in a GPU trainer's step whose description (the dump's, e.g.
// "relu_backward+wgrad+bias,...") `described` accepts.
template <typename Described>
int launches_of(const Trainer& gpu, std::string_view name, Described&& described) {
  const cuda::CudaProgram& program = program_of(gpu);
  int n = 0;
  for (const Launch& l : program.schedule().launches)
    n += l.lowering->name() == name && described(l.lowering->describe(program.graph(), l));
  return n;
}
int launches_of(const Trainer& gpu, std::string_view name) {
  return launches_of(gpu, name, [](const std::string&) { return true; });
}

// One step on each, the states compared by norm, then five more steps' losses.
void check_follows_cpu(Trainer& gpu, Trainer& cpu) {
  gpu.train(1);
  cpu.train(1);
  test::check_states_close(gpu, cpu, 1e-2, 1e-3);
  test::check_losses_follow(gpu, cpu, 5, 2e-2);
}
int tensor_core_launches(const Trainer& gpu) { return launches_of(gpu, "tensor_core_conv"); }

// `t` trained channels-last on the GPU and on the CPU backend from the same
// random images (drawn from `seed`): `check` reads the GPU trainer's launches
// first, then the GPU step must follow the CPU's.
template <typename Check>
void check_channels_last_follows_cpu(const SequentialTraining& t, std::uint64_t seed, Check&& check) {
  std::mt19937_64 rng(seed);
  const Shape& in = t.model.input_shape;
  const Dataset data = test::random_dataset(t.model.batch * 6, in[0] * in[1] * in[2], 10, rng);
  const auto gpu = channels_last_trainer(t, data);
  INFO(gpu->description());
  check(*gpu);
  check_follows_cpu(*gpu, *cpu_trainer(t, data));
}

void check_follows(const SequentialTraining& t, std::int64_t image_values) {
  std::mt19937_64 rng(36);
  const Dataset data = test::random_dataset(t.model.batch * 6, image_values, 10, rng);
  const test::StepsRun nchw = train(t, data, ActivationLayout::nchw);
  const test::StepsRun last = train(t, data, ActivationLayout::channels_last);
  INFO("NCHW:          " << nchw.description);
  INFO("channels-last: " << last.description);
  CHECK(nchw.description.find("NCHW (backend.activation_layout: nchw) activations") != std::string::npos);
  CHECK(last.description.find("channels-last (backend.activation_layout: channels_last) activations") !=
        std::string::npos);
  CHECK(test::relative_error(nchw.losses, last.losses) < 2e-2);
  // Every entry after one step; after the last, the weights only: the
  // momentum buffers are sums of gradients of random labels, where the two
  // layouts' different fp16 roundings (cuDNN's engines, timed at start-up,
  // differ between the layouts) grow apart step by step (4-6% after 8 steps
  // at 32/64 channels, measured on an H200) while the weights move by lr x them.
  const TrainingProgram program =
      build_sequential_program(t, data.train.images.count, data.test.images.count, ProgramTarget::cuda);
  std::set<std::string> weights;
  for (ValueId id : program.train.values_with_role(Role::param)) weights.insert(program.train.value(id).name);
  test::check_saved_states_close(nchw.first_state, last.first_state, 3e-2);
  test::check_saved_states_close(nchw.state, last.state, 3e-2, weights);
  CHECK(nchw.eval.examples == last.eval.examples);
  CHECK(std::abs(nchw.eval.loss - last.eval.loss) <= 2e-2 * std::abs(nchw.eval.loss));
}

}  // namespace

TEST_CASE("channels-last training follows the NCHW step: 3-channel images, SGD with momentum and AdamW") {
  for (const OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::adamw}) {
    INFO(optimizer_name(kind));
    check_follows(small_images(kind), 3 * 11 * 11);
  }
}

TEST_CASE("channels-last training follows the NCHW step: MNIST-sized images, 32 and 64 channels") {
  for (const OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::adamw}) {
    INFO(optimizer_name(kind));
    check_follows(mnist_sized(kind), 28 * 28);
  }
}

// The batch_norm layers' rows path against the CPU backend (f32 with the
// compute dtype's roundings), the oracle: the first step's state within 1e-2
// by norm (or 1e-3 absolute: the BN biases' gradients are sums of many f16
// terms that largely cancel), then the losses. Against the NCHW GPU step
// only the losses: the two layouts' f16 roundings (cuDNN engines, the
// statistics' summation order) move the BN biases apart by 5-15% by norm
// within 8 steps, as they move apart from the CPU's.
TEST_CASE("channels-last batch_norm (the rows path) follows the CPU backend: a residual CNN with global pooling") {
  for (const OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::adamw}) {
    INFO(optimizer_name(kind));
    const SequentialTraining t = batch_norm_residual(kind);
    std::mt19937_64 rng(38);
    const Dataset data = test::random_dataset(t.model.batch * 6, 28 * 28, 10, rng);
    const auto gpu = channels_last_trainer(t, data);
    const auto cpu = cpu_trainer(t, data);
    INFO(gpu->description());
    REQUIRE(gpu->description().find("channels-last") != std::string::npos);
    // The global pool, the classifier, the loss and the way back to channels-last: one launch, no permute of
    // an activation. (The three convolutions of 8+ input channels read their filters' [O,KH,KW,C] copies:
    // graph/filter_layout_pass.hpp.)
    if (!core_only_forced_for_tests()) {
      CHECK(launches_of(*gpu, "classifier_head") == 1);
      int filter_copies = 0;
      const cuda::CudaProgram& program = program_of(*gpu);
      for (const Launch& l : program.schedule().launches)
        filter_copies += l.lowering->name() == "channels_permute" && l.writes.size() == 1 &&
                         program.graph().value(l.writes[0]).name.ends_with("_krsc");
      CHECK(filter_copies == 3);
      CHECK(launches_of(*gpu, "channels_permute") == filter_copies);
    }
    check_follows_cpu(*gpu, *cpu);
    const test::StepsRun nchw = train(t, data, ActivationLayout::nchw);
    const test::StepsRun last = train(t, data, ActivationLayout::channels_last);
    CHECK(test::relative_error(nchw.losses, last.losses) < 2e-2);
  }
}

// Our channels-last tensor-core convolutions (ops/cuda/fast_paths/tensor_core_conv/conv_nhwc_mma.hpp,
// forced by backend.conv_kernels: tensor_core) inside the captured step:
// the residual CNN at 16 and 32 channels (three forwards and three backward
// data passes are theirs; the 1-channel first layer is few_channel_conv's)
// against the CPU backend, as above, and the mnist_cnn_fast network's
// second layer (5x5, 32 -> 64, bias + ReLU in the epilogue) against the
// NCHW step.
TEST_CASE("channels-last tensor-core convolutions in the training step follow the CPU backend and the NCHW step") {
  for (const OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::adamw}) {
    INFO(optimizer_name(kind));
    SequentialTraining t = batch_norm_residual(kind);
    t.model.layers = test::batch_norm_residual_layers(16);
    std::mt19937_64 rng(39);
    const Dataset data = test::random_dataset(t.model.batch * 6, 28 * 28, 10, rng);
    const auto gpu = channels_last_trainer(t, data, ConvKernels::tensor_core);
    CHECK(tensor_core_launches(*gpu) == 6);
    const auto cpu = cpu_trainer(t, data);
    check_follows_cpu(*gpu, *cpu);
  }
  SequentialTraining t = mnist_sized(OptimizerKind::adamw);
  std::mt19937_64 rng(40);
  const Dataset data = test::random_dataset(t.model.batch * 6, 28 * 28, 10, rng);
  const test::StepsRun nchw = train(t, data, ActivationLayout::nchw);
  const auto trainer = channels_last_trainer(t, data, ConvKernels::tensor_core);
  CHECK(tensor_core_launches(*trainer) == 2);
  const test::StepsRun last = test::run_steps(*trainer, kSteps);
  CHECK(test::relative_error(nchw.losses, last.losses) < 2e-2);
  test::check_saved_states_close(nchw.first_state, last.first_state, 3e-2);
}

// Our few-channel convolutions (ops/cuda/fast_paths/few_channel_conv/, under
// `auto`) inside the captured step against the CPU backend: RGB images whose
// first layer is 3 -> 8 (5x5, bias, then ReLU: the bias gradient in the
// weight gradient's pass, widened to the fp32 master's), and one-channel
// images whose first layer is 1 -> 16 (7x7, stride 2, no bias: the weight
// gradient alone).
TEST_CASE("channels-last few-channel first layers in the training step follow the CPU backend") {
  for (const bool rgb : {true, false}) {
    INFO((rgb ? "RGB, 3 -> 8, 5x5" : "one channel, 1 -> 16, 7x7 stride 2"));
    SequentialTraining t = small_images(OptimizerKind::adamw);
    t.model.input_shape = rgb ? Shape{3, 12, 12} : Shape{1, 15, 15};
    t.model.layers[0] = rgb ? test::net_layer(LayerKind::conv2d, 8, 5, 2) : test::net_layer(LayerKind::conv2d, 16, 7, 3, 2);
    t.model.layers[0].bias = rgb;
    check_channels_last_follows_cpu(t, 41, [](const Trainer& gpu) {
      CHECK(launches_of(gpu, "few_channel_conv") == 1);
      CHECK(launches_of(gpu, "few_channel_wgrad") == 1);
    });
  }
}

// A first layer whose activation is read by the next convolution (no pooling
// between, as bench/networks/wide_adam.yaml): the activation's backward
// rides in the few-channel weight gradient (its gate), not in a launch of
// its own, and the step follows the CPU backend, for
// ReLU, exact GELU (its backward reads the pre-activation) and tanh.
TEST_CASE("a few-channel first layer's activation backward in its weight gradient follows the CPU backend") {
  for (const MlpActivation a : {MlpActivation::relu, MlpActivation::gelu, MlpActivation::tanh}) {
    SequentialTraining t = small_images(OptimizerKind::adam);
    t.model.input_shape = {1, 12, 12};
    t.model.layers = {test::net_layer(LayerKind::conv2d, 16, 3, 1), test::activation_layer(a),
                      test::net_layer(LayerKind::conv2d, 16, 3, 1), test::net_layer(LayerKind::activation),
                      test::net_layer(LayerKind::max_pool2d, 0, 2, 0, 2), test::net_layer(LayerKind::flatten),
                      test::net_layer(LayerKind::linear, 10)};
    check_channels_last_follows_cpu(t, 42, [&](const Trainer& gpu) {
      // (GELU's and tanh's forwards stay element-wise launches: the few-channel forward fuses ReLU only.)
      if (a == MlpActivation::relu) CHECK(launches_of(gpu, "elementwise") == 0);
      const std::string gate = std::string(activation_name(a)) + "_backward+wgrad+bias";
      CHECK(launches_of(gpu, "few_channel_wgrad", [&](const std::string& what) { return what.rfind(gate, 0) == 0; }) ==
            1);
    });
  }
}

// GELU and tanh each applied in the pass of the max pooling after them
// (windows that tile: 12 -> 6 -> 3), the pooling's backward taking their
// backward: the step follows the CPU backend.
TEST_CASE("activations applied in the pooling's pass follow the CPU backend") {
  SequentialTraining t = small_images(OptimizerKind::adamw);
  t.model.input_shape = {1, 12, 12};
  t.model.layers = {test::net_layer(LayerKind::conv2d, 16, 3, 1),
                    test::activation_layer(MlpActivation::gelu),
                    test::net_layer(LayerKind::max_pool2d, 0, 2),
                    test::net_layer(LayerKind::conv2d, 16, 3, 1),
                    test::activation_layer(MlpActivation::tanh),
                    test::net_layer(LayerKind::max_pool2d, 0, 2),
                    test::net_layer(LayerKind::flatten),
                    test::net_layer(LayerKind::linear, 10)};
  check_channels_last_follows_cpu(t, 43, [](const Trainer& gpu) {
    CHECK(launches_of(gpu, "elementwise") == 0);
    const auto pools_2x2 = [](const std::string& what) { return what.find("+k=2") != std::string::npos; };
    CHECK(launches_of(gpu, "max_pool2d", pools_2x2) == 2);
  });
}

// A dropout2d and mean poolings inside the region (they had ended it, so the
// whole network ran NCHW): channels-last launches of their own, the same
// channels dropped as the CPU backend's NCHW step drops, the step following it.
TEST_CASE("channels-last dropout2d and avg_pool2d in the training step follow the CPU backend") {
  SequentialTraining t = small_images(OptimizerKind::adamw);
  t.model.input_shape = {1, 14, 14};
  LayerSpec drop = test::net_layer(LayerKind::dropout2d);
  drop.p = 0.3;
  t.model.layers = {test::net_layer(LayerKind::conv2d, 16, 3, 1),
                    test::activation_layer(MlpActivation::tanh),
                    test::net_layer(LayerKind::avg_pool2d, 0, 2),
                    drop,
                    test::net_layer(LayerKind::conv2d, 24, 3, 1),
                    test::net_layer(LayerKind::activation),
                    test::net_layer(LayerKind::avg_pool2d, 0, 3, 0, 2),
                    test::net_layer(LayerKind::flatten),
                    test::net_layer(LayerKind::linear, 10)};
  check_channels_last_follows_cpu(t, 44, [](const Trainer& gpu) {
    const auto channels_last = [](const std::string& what) { return what.find("channels_last") != std::string::npos; };
    CHECK(launches_of(gpu, "dropout2d", channels_last) == 2);   // forward and backward
    CHECK(launches_of(gpu, "avg_pool2d", channels_last) == 4);  // two poolings, each both ways
  });
}

// A dropout between the last pooling and the flatten (Keras-style): the
// region's exit moves before it, written by the pooling's launch; the
// dropout keeps its NCHW bits, so the step follows the CPU backend's.
TEST_CASE("a dropout before the flatten after a channels-last region follows the CPU backend") {
  SequentialTraining t = small_images(OptimizerKind::adamw);
  t.model.input_shape = {1, 12, 12};
  LayerSpec drop = test::net_layer(LayerKind::dropout);
  drop.p = 0.3;
  t.model.layers = {test::net_layer(LayerKind::conv2d, 16, 3, 1), test::net_layer(LayerKind::activation),
                    test::net_layer(LayerKind::max_pool2d, 0, 2),  drop,
                    test::net_layer(LayerKind::flatten),           test::net_layer(LayerKind::linear, 10)};
  check_channels_last_follows_cpu(t, 45, [](const Trainer& gpu) {
    const auto exits = [](const std::string& what) { return what.find("to_channels_first") != std::string::npos; };
    CHECK(launches_of(gpu, "max_pool2d", exits) == 1);
    CHECK(launches_of(gpu, "dropout") == 2);  // forward and backward, NCHW
  });
}
