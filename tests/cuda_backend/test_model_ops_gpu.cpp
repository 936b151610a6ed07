// Issue 21's activations, losses and dropout on the GPU against the CPU
// reference: each op through the generic cover on random shapes (outputs
// poisoned first, so an unwritten element shows as NaN), dropout's mask bits
// equal on both backends, and whole training runs (GPU vs CPU loss curves;
// graph replay, stream launches, K steps per graph and resume giving the
// same bits with dropout).
#include <doctest/doctest.h>

#include <cuda_fp16.h>

#include <cmath>
#include <map>
#include <numeric>

#include "ops/cuda/cuda_check.hpp"
#include "runtime/cpu/cpu_executor.hpp"
#include "runtime/cuda/cuda_program.hpp"
#include "runtime/cuda/cuda_trainer.hpp"
#include "runtime/tensor_blob.hpp"
#include "tests/cuda_backend/gpu_reference_check.hpp"
#include "tests/cuda_backend/launch_paths_check.hpp"
#include "tests/runtime/test_support.hpp"
#include "tests/support/training_helpers.hpp"
#include "tests/support/core_only_skips.hpp"

using namespace sg;
using sg::test::all_parameters;
using sg::test::check_gpu_matches_cpu;
using sg::test::cpu_spec;
using sg::test::cuda_spec;
using sg::test::losses;
using sg::test::MlpTrainerSpec;
using sg::test::random_dataset;

TEST_CASE("gelu_tanh, silu, tanh, sigmoid and their gradients match the CPU reference on the GPU") {
  auto rng = sg::test::fresh_rng();
  for (const OpKind op : {OpKind::gelu_tanh, OpKind::silu, OpKind::tanh, OpKind::sigmoid})
    for (const DType dtype : {DType::f32, DType::f16}) {
      const std::int64_t rows = 1 + std::int64_t(rng() % 37), cols = 1 + std::int64_t(rng() % 301);
      INFO(op_name(op) << " " << dtype_name(dtype) << " [" << rows << "," << cols << "], seed " << sg::test::last_seed());
      Graph g;
      const ValueId x = g.input("x", {rows, cols}, dtype);
      const ValueId dy = g.input("dy", {rows, cols}, dtype);
      const ValueId y = g.append_node(op, {x}, NoAttrs{}).front();
      // tanh and sigmoid's backwards read the forward output, the others the input.
      const bool reads_output = op == OpKind::tanh || op == OpKind::sigmoid;
      const auto backward = static_cast<OpKind>(static_cast<int>(op) + 1);
      const ValueId dx = g.append_node(backward, {dy, reads_output ? y : x}, NoAttrs{}).front();
      g.mark_output(y);
      g.mark_output(dx);
      check_gpu_matches_cpu(g, rng, dtype == DType::f16 ? 3e-3 : 1e-5, -4.0, 4.0);
    }
}

// Each loss backward with the gradient scale of one rank (1) and of a data-parallel rank of 2 or 3 (issue 38).
TEST_CASE("mse and l1 losses and their gradients match the CPU reference on the GPU") {
  auto rng = sg::test::fresh_rng();
  for (const OpKind op : {OpKind::mse_loss, OpKind::l1_loss})
    for (const DType dtype : {DType::f32, DType::f16})
      for (const double scale : {1.0, 0.5, 1.0 / 3.0}) {
        const std::int64_t rows = 1 + std::int64_t(rng() % 300), cols = 1 + std::int64_t(rng() % 17);
        INFO(op_name(op) << " " << dtype_name(dtype) << " [" << rows << "," << cols << "] gradient scale " << scale
                         << ", seed " << sg::test::last_seed());
        Graph g;
        const ValueId pred = g.input("pred", {rows, cols}, dtype);
        const ValueId target = g.label("target", {rows, cols}, DType::f32);
        g.mark_output(g.append_node(op, {pred, target}, NoAttrs{}).front());
        g.mark_output(g.append_node(static_cast<OpKind>(static_cast<int>(op) + 1), {pred, target},
                                    LossGradientAttrs{scale})
                          .front());
        check_gpu_matches_cpu(g, rng, dtype == DType::f16 ? 3e-3 : 1e-5, -2.0, 2.0);
      }
}

// Plain and label-smoothed cross-entropy, each gradient at the scale of one rank (1) and of a data-parallel
// rank of 2, 3 or 4 (issue 38).
TEST_CASE("cross-entropy and label-smoothed cross-entropy and their gradients match the CPU reference on the GPU") {
  auto rng = sg::test::fresh_rng();
  for (const bool smoothed : {false, true})
    for (const DType dtype : {DType::f32, DType::f16})
      for (const double scale : {1.0, 0.5, 1.0 / 3.0, 0.25}) {
        const std::int64_t rows = 1 + std::int64_t(rng() % 700), cols = 2 + std::int64_t(rng() % 70);
        INFO((smoothed ? "smoothed " : "") << dtype_name(dtype) << " [" << rows << "," << cols << "] gradient scale "
                                           << scale << ", seed " << sg::test::last_seed());
        Graph g;
        const ValueId logits = g.input("logits", {rows, cols}, dtype);
        const ValueId labels = g.label("labels", {rows}, DType::i32);
        const auto loss = smoothed ? OpKind::softmax_xent_smoothed : OpKind::softmax_xent;
        const auto backward = smoothed ? OpKind::softmax_xent_smoothed_backward : OpKind::softmax_xent_backward;
        const OpAttrs attrs = smoothed ? OpAttrs{LabelSmoothingAttrs{0.1}} : OpAttrs{NoAttrs{}};
        const OpAttrs gradient_attrs =
            smoothed ? OpAttrs{LabelSmoothingAttrs{0.1, scale}} : OpAttrs{LossGradientAttrs{scale}};
        g.mark_output(g.append_node(loss, {logits, labels}, attrs).front());
        g.mark_output(g.append_node(backward, {logits, labels}, gradient_attrs).front());
        check_gpu_matches_cpu(g, rng, dtype == DType::f16 ? 3e-3 : 1e-5, -5.0, 5.0, cols);
      }
}

TEST_CASE("dropout on the GPU keeps exactly the CPU reference's elements, step after step") {
  auto rng = sg::test::fresh_rng();
  for (const DType dtype : {DType::f32, DType::f16})
    for (const std::int32_t step : {0, 1, 977}) {
      const std::int64_t n = 1 + std::int64_t(rng() % 5000);
      INFO(dtype_name(dtype) << " n " << n << " step " << step << ", seed " << sg::test::last_seed());
      Graph g;
      const ValueId x = g.input("x", {n}, dtype);
      const ValueId dy = g.input("dy", {n}, dtype);
      const ValueId s = g.state("step", {1}, DType::i32);
      const DropoutAttrs attrs{0.3, 0x1234567890abcdefull, 2};
      g.mark_output(g.append_node(OpKind::dropout, {x, s}, attrs).front());
      g.mark_output(g.append_node(OpKind::dropout_backward, {dy, s}, attrs).front());
      // Inputs in [0.5, 1.5]: never zero, so the relative error also sees
      // every mask bit that differs (a kept element is >= 0.7).
      check_gpu_matches_cpu(g, rng, dtype == DType::f16 ? 1e-3 : 1e-6, 0.5, 1.5, 2, step);
    }
}

namespace {

MlpTrainerSpec small_spec() {
  MlpTrainerSpec spec;
  spec.mlp.layers = {37, 129, 65, 11};
  spec.mlp.batch = 33;
  spec.mlp.weight_dtype = DType::f32;
  spec.optimizer = {0.05, 0.9, 0.0};
  spec.eval_batch = 100;
  spec.init_seed = 3;
  spec.shuffle_seed = 5;
  return spec;
}

// The first `steps` losses of a CPU and a GPU trainer follow each other
// (and, with `must_learn`, the last 10 average below the first 10).
void check_loss_curves(const MlpTrainerSpec& spec, const Dataset& data, int steps, bool must_learn) {
  auto cpu = make_cpu_trainer(cpu_spec(spec, data), data);
  cuda::CudaTrainer gpu(cuda_spec(spec, data), data);
  gpu.poison_activations();
  const auto gpu_losses = losses(gpu, steps);
  const auto cpu_losses = losses(*cpu, steps);
  MESSAGE("loss step 1 gpu " << gpu_losses[0] << " cpu " << cpu_losses[0] << ", step " << steps << " gpu "
                             << gpu_losses.back() << " cpu " << cpu_losses.back());
  CHECK(sg::test::relative_error(gpu_losses, cpu_losses) < 1e-2);
  if (must_learn)
    CHECK(std::accumulate(gpu_losses.end() - 10, gpu_losses.end(), 0.0) <
          std::accumulate(gpu_losses.begin(), gpu_losses.begin() + 10, 0.0));
  const EvalResult ge = gpu.evaluate(), ce = cpu->evaluate();
  CHECK(std::abs(ge.loss - ce.loss) / ce.loss < 1e-2);
  CHECK(std::isnan(ge.accuracy) == is_regression(spec.mlp.loss));
}

// A regression dataset: the targets are a fixed smooth function of the inputs.
Dataset regression_dataset(std::int64_t rows, std::int64_t cols, std::int64_t width, std::mt19937_64& rng) {
  Dataset d = random_dataset(rows, cols, 2, rng);
  for (data::Split* s : {&d.train, &d.test}) {
    s->classes = 0;
    s->labels.labels.clear();
    s->labels.target_width = width;
    s->labels.targets.resize(static_cast<std::size_t>(s->images.count * width));
    for (std::int64_t i = 0; i < s->images.count; ++i)
      for (std::int64_t k = 0; k < width; ++k) {
        double acc = 0;
        for (std::int64_t j = k; j < cols; j += width) acc += s->images.pixels[i * cols + j] / 255.0;
        s->labels.targets[i * width + k] = static_cast<float>(std::sin(acc));
      }
  }
  return d;
}

}  // namespace

TEST_CASE("gelu_tanh + dropout + label smoothing: 60 CUDA steps follow the CPU backend's loss curve") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  const Dataset data = random_dataset(400, 37, 11, rng);
  MlpTrainerSpec spec = small_spec();
  spec.mlp.activation = MlpActivation::gelu_tanh;
  spec.mlp.dropout = 0.2;
  spec.mlp.dropout_seed = 17;
  spec.mlp.label_smoothing = 0.1;
  check_loss_curves(spec, data, 60, true);
  for (const auto a : {MlpActivation::gelu, MlpActivation::silu, MlpActivation::tanh, MlpActivation::sigmoid,
                       MlpActivation::identity}) {
    INFO("activation " << activation_name(a));
    MlpTrainerSpec s = small_spec();
    s.mlp.activation = a;
    check_loss_curves(s, data, 30, false);
  }
}

TEST_CASE("gelu_tanh through cuBLASLt's GELU_AUX_BIAS / DGELU epilogues follows the CPU backend") {
  SG_SKIP_IF_CORE_ONLY("our small-batch kernels");
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  const Dataset data = random_dataset(400, 37, 11, rng);
  MlpTrainerSpec spec = small_spec();
  spec.mlp.layers = {37, 128, 64, 11};  // hidden widths multiples of 8: the epilogues take the GELU
  spec.mlp.activation = MlpActivation::gelu_tanh;
  {
    cuda::CudaTrainer gpu(cuda_spec(spec, data), data);
    const auto& program = gpu.training_program();
    int aux = 0, dgelu = 0, small_k = 0;
    for (const Launch& l : program.schedule().launches) {
      const std::string note = l.lowering->describe(program.graph(), l);
      aux += note.find("epilogue=gelu_aux_bias") != std::string::npos;
      dgelu += note.find("epilogue=dgelu") != std::string::npos;
      small_k += l.lowering->name() == "small_k_dgrad_relu";
    }
    CHECK(aux == 2);
    // The dgrad into the first hidden layer; the one from the 11-wide
    // classifier (<= 32 terms) is our small-K kernel's, through gelu_tanh too.
    CHECK(dgelu == 1);
    CHECK(small_k == 1);
  }
  check_loss_curves(spec, data, 60, true);
}

TEST_CASE("every activation through our small-batch kernels (forward, one-pass, output layer, small-K dgrad) follows the CPU") {
  SG_SKIP_IF_CORE_ONLY("our small-batch kernels");
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  const Dataset data = random_dataset(400, 64, 11, rng);
  for (const auto a : {MlpActivation::relu, MlpActivation::gelu, MlpActivation::gelu_tanh, MlpActivation::silu,
                       MlpActivation::tanh, MlpActivation::sigmoid}) {
    const std::string act(activation_name(a));
    INFO("activation " << act);
    for (const double momentum : {0.0, 0.9}) {
      INFO("momentum " << momentum);
      MlpTrainerSpec spec = small_spec();
      spec.mlp.layers = {64, 128, 64, 11};  // widths our batch-32 kernels take
      spec.mlp.batch = 32;
      spec.mlp.weight_dtype = DType::f16;
      spec.mlp.activation = a;
      spec.optimizer = {0.05, momentum, 0.0};
      {
        cuda::CudaTrainer gpu(cuda_spec(spec, data), data);
        const auto& program = gpu.training_program();
        std::map<std::string, int> ours;
        for (const Launch& l : program.schedule().launches) {
          const std::string note = l.lowering->describe(program.graph(), l);
          CAPTURE(note);
          // No activation (or its backward) runs as a launch of its own (with momentum the
          // dgrads between hidden layers are cuBLASLt's, followed by the map).
          if (l.lowering->name() == "elementwise" && momentum == 0.0)
            CHECK(std::string(op_name(program.graph().node(l.nodes[0]).op)).rfind(act, 0) != 0);
          const bool names_it = a == MlpActivation::relu ? note.find("relu") != std::string::npos
                                                         : note.find(act) != std::string::npos;
          if (names_it) ++ours[std::string(l.lowering->name())];
        }
        // (A ReLU forward whose mask a cuBLASLt dgrad reads stays cuBLASLt's: with momentum, the first.)
        CHECK(ours["small_batch_forward"] == (a == MlpActivation::relu && momentum > 0 ? 1 : 2));
        if (momentum == 0.0) {
          CHECK(ours["output_layer_backward"] == 1);
          CHECK(ours["one_pass_strips"] == 1);
        } else {
          CHECK(ours["small_k_dgrad_relu"] == 1);
        }
      }
      check_loss_curves(spec, data, 30, false);
    }
  }
}

// The last hidden activation applied by the classifier's forward as it loads
// its input (its tensor-core tiles: batch 64 and up), with fp32 master
// weights and momentum, and with fp16 weights and plain SGD.
TEST_CASE("the classifier's forward applying the last activation on its load follows the CPU backend") {
  SG_SKIP_IF_CORE_ONLY("the classifier's kernel");
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  const Dataset data = random_dataset(600, 64, 11, rng);
  struct Shape {
    std::int64_t batch, width;
    DType weights;
    double momentum;
  };
  const std::vector<Shape> shapes = {{128, 128, DType::f32, 0.9}, {256, 144, DType::f16, 0.0}};
  for (const auto a : {MlpActivation::gelu, MlpActivation::silu, MlpActivation::tanh, MlpActivation::sigmoid})
    for (const Shape& sh : shapes) {
      const std::string act(activation_name(a));
      INFO("activation " << act << ", batch " << sh.batch);
      MlpTrainerSpec spec = small_spec();
      spec.mlp.layers = {64, 256, sh.width, 11};
      spec.mlp.batch = sh.batch;
      spec.mlp.weight_dtype = sh.weights;
      spec.mlp.activation = a;
      spec.optimizer = {0.05, sh.momentum, 0.0};
      {
        cuda::CudaTrainer gpu(cuda_spec(spec, data), data);
        const auto& program = gpu.training_program();
        int folded = 0;
        for (const Launch& l : program.schedule().launches)
          folded += l.lowering->describe(program.graph(), l) == act + " on the input's load,epilogue=bias";
        CHECK(folded == 1);
      }
      check_loss_curves(spec, data, 30, false);
    }
}

TEST_CASE("mse and l1 regression: CUDA steps follow the CPU backend, the eval reports loss only") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  const Dataset data = regression_dataset(400, 37, 3, rng);
  for (const auto loss : {MlpLoss::mse, MlpLoss::l1}) {
    INFO("loss " << loss_name(loss));
    MlpTrainerSpec spec = small_spec();
    spec.mlp.layers = {37, 64, 3};
    spec.mlp.loss = loss;
    spec.mlp.target_width = 3;
    spec.mlp.activation = MlpActivation::silu;
    check_loss_curves(spec, data, 60, true);
  }
}

TEST_CASE("with dropout, graph replay, stream launches, K steps per graph and resume give the same bits") {
  auto rng = sg::test::fresh_rng();
  const Dataset data = random_dataset(400, 37, 11, rng);
  MlpTrainerSpec spec = small_spec();
  spec.mlp.weight_dtype = DType::f16;
  spec.mlp.dropout = 0.3;
  spec.mlp.dropout_seed = 99;
  sg::test::check_launch_paths_agree(spec, data, 41, 4, [](cuda::CudaTrainer&) {});
  const TrainerSpec gpu_spec = cuda_spec(spec, data);
  cuda::CudaTrainer straight(gpu_spec, data), first(gpu_spec, data), second(gpu_spec, data);
  straight.train(50);
  first.train(25);
  second.load_state(first.save_state());
  second.train(25);
  sg::test::check_same_state(straight, second);
}
