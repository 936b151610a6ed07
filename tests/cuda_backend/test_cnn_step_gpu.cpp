// Issue 22's fused CNN step (ops/cuda/fast_paths/cnn_step/cnn_step.cu, lowering cnn_step) on
// random sequential CNNs: odd image sizes, 1-3 input channels, stride 1 and
// 2 (also in a layer whose input gradient is computed), padding 0-2, 3x3 and
// 5x5 kernels, overlapping pooling windows, dropout2d
// and dropout, batches from 5 to 200 (several examples per block). After one
// step every parameter and velocity must agree with the CPU backend (fp16
// rounding emulated) and with the per-launch CUDA schedule; the losses of
// ten more steps must follow the CPU's; replay and stream launches give the
// same bits. A NaN anywhere fails (test::relative_error).
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <cmath>
#include <random>
#include <string>

#include "models/sequential_program.hpp"
#include "runtime/cuda/cuda_trainer.hpp"
#include "runtime/tensor_blob.hpp"
#include "tests/runtime/test_support.hpp"
#include "tests/support/training_helpers.hpp"
#include "tests/support/core_only_skips.hpp"

using namespace sg;

namespace {

struct RandomCnn {
  SequentialTraining training;
  std::int64_t classes = 0;
  std::string text;
};

using sg::test::pick;

// A random CNN whose layer list fits its input (retried until it does);
// `strided_second_conv`: always a second conv layer, of stride 2.
RandomCnn random_cnn(std::mt19937_64& rng, std::int64_t batch, bool strided_second_conv = false) {
  for (;;) {
    RandomCnn r;
    auto& m = r.training.model;
    m.input_shape = {pick(rng, 1, 3), pick(rng, 9, 17), pick(rng, 9, 17)};
    LayerSpec conv{LayerKind::conv2d};
    conv.out = pick(rng, 3, 9);
    conv.kernel = rng() % 2 ? 3 : 5;
    conv.stride = pick(rng, 1, 2);
    conv.padding = pick(rng, 0, 2);
    m.layers = {conv};
    if (rng() % 2) {
      LayerSpec drop{LayerKind::dropout2d};
      drop.p = 0.3;
      m.layers.push_back(drop);
    }
    LayerSpec pool{LayerKind::max_pool2d};
    pool.kernel = rng() % 2 ? 2 : 3;
    pool.stride = 2;  // kernel 3: overlapping windows
    m.layers.push_back(pool);
    m.layers.push_back(LayerSpec{LayerKind::activation});
    if (strided_second_conv || rng() % 2) {
      LayerSpec conv2{LayerKind::conv2d};  // its input gradient: stride 1 from a zero-bordered dY, stride 2 tested
      conv2.out = pick(rng, 4, 12);
      conv2.kernel = 3;
      conv2.stride = strided_second_conv ? 2 : pick(rng, 1, 2);
      conv2.padding = pick(rng, 0, 1);
      m.layers.push_back(conv2);
      m.layers.push_back(LayerSpec{LayerKind::activation});
    }
    m.layers.push_back(LayerSpec{LayerKind::flatten});
    LayerSpec hidden{LayerKind::linear};
    hidden.out = pick(rng, 8, 40);
    m.layers.push_back(hidden);
    m.layers.push_back(LayerSpec{LayerKind::activation});
    if (rng() % 2) {
      LayerSpec drop{LayerKind::dropout};
      drop.p = 0.25;
      m.layers.push_back(drop);
    }
    r.classes = pick(rng, 3, 10);
    LayerSpec logits{LayerKind::linear};
    logits.out = r.classes;
    m.layers.push_back(logits);
    try {
      infer_sequential_shapes(m.input_shape, m.layers);
    } catch (const SequentialShapeError&) {
      continue;
    }
    m.batch = batch;
    m.weight_dtype = DType::f32;
    m.compute_dtype = DType::f16;
    r.training.optimizer.lr = 0.05;
    r.training.optimizer.momentum = rng() % 2 ? 0.9 : 0.0;
    r.training.optimizer.weight_decay = rng() % 2 ? 1e-3 : 0.0;
    r.training.eval_batch = 16;
    r.training.init_seed = rng();
    r.text = fmt::format("input {}x{}x{}, batch {}, momentum {}, weight decay {}:", m.input_shape[0],
                         m.input_shape[1], m.input_shape[2], batch, r.training.optimizer.momentum,
                         r.training.optimizer.weight_decay);
    for (const LayerSpec& l : m.layers)
      r.text += fmt::format(" {}{}", layer_name(l),
                            l.kind == LayerKind::conv2d
                                ? fmt::format("({}, k{}, s{}, p{})", l.out, l.kernel, layer_stride(l), l.padding)
                            : l.kind == LayerKind::max_pool2d ? fmt::format("(k{}, s{})", l.kernel, layer_stride(l))
                            : l.kind == LayerKind::linear     ? fmt::format("({})", l.out)
                                                              : std::string());
    return r;
  }
}

std::unique_ptr<Trainer> make_trainer(const RandomCnn& r, const Dataset& data, ProgramTarget target,
                                      bool whole_step = true, bool cuda_graph = true) {
  TrainerSpec spec;
  spec.program = build_sequential_program(r.training, data.train.images.count, data.test.images.count, target);
  spec.backend.whole_step = whole_step;
  spec.cuda_graph = cuda_graph;
  return target == ProgramTarget::cpu ? make_cpu_trainer(spec, data) : cuda::make_cuda_trainer(spec, data);
}

void check_same_state(Trainer& a, Trainer& b, double tolerance) {
  const auto x = a.save_state();
  const auto y = b.save_state();
  REQUIRE(x.size() == y.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (x[i].dtype == DType::i32) {
      CHECK(x[i] == y[i]);  // the step counter
      continue;
    }
    CAPTURE(x[i].name);
    CHECK(test::relative_error(floats_from_blob(x[i]), floats_from_blob(y[i])) < tolerance);
  }
}

// The fused step, the per-launch schedule and the CPU backend on one random
// dataset of four batches (held on the heap: the trainers may keep a
// reference to it); the first must run as cnn_step, the second not.
struct ThreeTrainers {
  std::unique_ptr<const Dataset> data;
  std::unique_ptr<Trainer> fused, per_launch, cpu;
};
ThreeTrainers three_trainers(const RandomCnn& r, std::mt19937_64& rng) {
  const std::int64_t batch = r.training.model.batch;
  const auto& shape = r.training.model.input_shape;
  ThreeTrainers t;
  t.data = std::make_unique<const Dataset>(
      test::random_dataset(batch * 4, shape[0] * shape[1] * shape[2], r.classes, rng));
  t.fused = make_trainer(r, *t.data, ProgramTarget::cuda);
  t.per_launch = make_trainer(r, *t.data, ProgramTarget::cuda, /*whole_step=*/false);
  t.cpu = make_trainer(r, *t.data, ProgramTarget::cpu);
  INFO(t.fused->description());
  REQUIRE(t.fused->description().find("cnn_step") != std::string::npos);
  REQUIRE(t.per_launch->description().find("cnn_step") == std::string::npos);
  return t;
}

// One step: every parameter and state as the CPU backend's and the
// per-launch schedule's (the same masks and the same gradients up to
// summation order and rounding: the velocities hold the first gradients);
// then ten more steps' losses (a new epoch permutation after the fourth) as
// the CPU's. `tolerance` is the state's relative error by norm.
void check_follows_cpu_and_per_launch(const RandomCnn& r, std::mt19937_64& rng, double tolerance) {
  const ThreeTrainers t = three_trainers(r, rng);
  Trainer* const fused = t.fused.get();
  Trainer* const per_launch = t.per_launch.get();
  Trainer* const cpu = t.cpu.get();
  INFO(fused->description());
  fused->train(1);
  per_launch->train(1);
  cpu->train(1);
  check_same_state(*fused, *cpu, tolerance);
  check_same_state(*fused, *per_launch, tolerance);
  CHECK(std::abs(fused->last_loss() - cpu->last_loss()) < tolerance * std::abs(cpu->last_loss()) + 1e-3);
  for (int step = 1; step <= 10; ++step) {
    fused->train(1);
    cpu->train(1);
    CAPTURE(step);
    REQUIRE(std::isfinite(fused->last_loss()));
    CHECK(std::abs(fused->last_loss() - cpu->last_loss()) < 2 * tolerance * std::abs(cpu->last_loss()) + 1e-3);
  }
}

}  // namespace

TEST_CASE("random CNNs: the fused CNN step follows the CPU backend and the per-launch schedule") {
  SG_SKIP_IF_CORE_ONLY("the fused CNN step");
  std::mt19937_64 rng(22);
  for (const std::int64_t batch : {5, 16, 33, 64, 200}) {
    const RandomCnn r = random_cnn(rng, batch, /*strided_second_conv=*/batch == 33);
    CAPTURE(r.text);
    check_follows_cpu_and_per_launch(r, rng, 1e-2);
  }
}

// bf16 runs kernel 1's bf16 instance (bf16 tensor-core products, every value
// rounded to bf16 as the graph's), Nesterov SGD the update kernel's
// sgd_nesterov_step, and an activation other than ReLU its own layer phase
// (activation.cuh's math; gelu, gelu_tanh and silu read the forward's input
// in the backward, tanh and sigmoid its output). bf16 keeps 8 bits where
// fp16 keeps 11: a gradient summed in another order rounds one bf16 step
// apart (0.4%) more often, so the tolerance is three times fp16's.
TEST_CASE("random CNNs in bf16 with Nesterov SGD and every activation: the fused step follows the CPU backend and "
          "the per-launch schedule") {
  SG_SKIP_IF_CORE_ONLY("the fused CNN step");
  struct Case {
    DType compute;
    bool nesterov;
    std::int64_t batch;
    MlpActivation activation;
  };
  std::mt19937_64 rng(36);
  for (const Case c :
       {Case{DType::f16, true, 33, MlpActivation::gelu}, Case{DType::bf16, false, 16, MlpActivation::relu},
        Case{DType::bf16, true, 64, MlpActivation::tanh}, Case{DType::f16, false, 40, MlpActivation::silu},
        Case{DType::bf16, true, 200, MlpActivation::sigmoid}, Case{DType::f16, false, 24, MlpActivation::gelu_tanh}}) {
    RandomCnn r = random_cnn(rng, c.batch, /*strided_second_conv=*/c.batch == 64);
    r.training.model.compute_dtype = c.compute;
    r.training.optimizer.nesterov = c.nesterov;
    if (c.nesterov) r.training.optimizer.momentum = 0.9;
    for (LayerSpec& l : r.training.model.layers)
      if (l.kind == LayerKind::activation) l.activation = c.activation;
    CAPTURE(r.text);
    CAPTURE(dtype_name(c.compute));
    CAPTURE(c.nesterov);
    CAPTURE(int(c.activation));
    check_follows_cpu_and_per_launch(r, rng, c.compute == DType::bf16 ? 3e-2 : 1e-2);
  }
}

TEST_CASE("the fused CNN step: graph replay and stream launches end in the same bits") {
  SG_SKIP_IF_CORE_ONLY("the fused CNN step");
  std::mt19937_64 rng(7);
  const RandomCnn r = random_cnn(rng, 40);
  CAPTURE(r.text);
  const auto& shape = r.training.model.input_shape;
  const Dataset data = test::random_dataset(160, shape[0] * shape[1] * shape[2], r.classes, rng);
  const auto replay = make_trainer(r, data, ProgramTarget::cuda);
  const auto stream = make_trainer(r, data, ProgramTarget::cuda, true, /*cuda_graph=*/false);
  REQUIRE(replay->description().find("cnn_step") != std::string::npos);
  REQUIRE(stream->description().find("cnn_step") != std::string::npos);
  replay->train(9);
  stream->train(9);
  test::check_same_state(*replay, *stream);
  CHECK(replay->last_loss() == stream->last_loss());
}

// The parameter image (ops/cuda/fast_paths/cnn_step/cnn_step.hpp: the fp16 weight layouts every
// block copies in) is written by the update kernel after each step and
// rebuilt from the fp32 weights after the host writes them. Both must give
// the same bits, and a loaded state must not run on the image of the weights
// it replaced.
TEST_CASE("the fused CNN step's parameter image: kept by the updates == rebuilt after a loaded state") {
  SG_SKIP_IF_CORE_ONLY("the fused CNN step");
  std::mt19937_64 rng(25);
  const RandomCnn r = random_cnn(rng, 40, /*strided_second_conv=*/true);
  CAPTURE(r.text);
  const auto& shape = r.training.model.input_shape;
  const Dataset data = test::random_dataset(160, shape[0] * shape[1] * shape[2], r.classes, rng);
  const auto a = make_trainer(r, data, ProgramTarget::cuda);
  const auto b = make_trainer(r, data, ProgramTarget::cuda);
  REQUIRE(a->description().find("cnn_step") != std::string::npos);
  a->train(3);
  const auto saved = a->save_state();
  a->train(2);
  const auto kept = a->save_state();  // steps 4 and 5 on the image the updates wrote
  a->load_state(saved);               // over the image of step 5's weights
  a->train(2);
  const auto reloaded = a->save_state();
  b->load_state(saved);  // over the image of b's initial weights
  b->train(2);
  const auto fresh = b->save_state();
  test::check_same_state(kept, reloaded);
  test::check_same_state(kept, fresh);
}

namespace {

// Every floating state tensor's change from `before` to `after`, end to end.
std::vector<float> state_change(const std::vector<io::TensorBlob>& before, const std::vector<io::TensorBlob>& after) {
  REQUIRE(before.size() == after.size());
  std::vector<float> change;
  for (std::size_t i = 0; i < before.size(); ++i) {
    if (before[i].dtype == DType::i32) continue;
    const std::vector<float> a = floats_from_blob(before[i]), b = floats_from_blob(after[i]);
    for (std::size_t k = 0; k < a.size(); ++k) change.push_back(b[k] - a[k]);
  }
  return change;
}

}  // namespace

// Issue 35: the update kernel applies any update rule to the summed partial
// gradients. What each step changes (weights and rule states) must follow the
// CPU backend and the per-launch schedule. eps = 1e-3 keeps an update
// proportional to its gradient where the gradient is small (with eps = 1e-8
// it is lr times the gradient's sign, which fp16 rounding of a near-zero
// gradient flips), so the changes compare by norm; Adam's bias correction read
// at the advanced step counter would change the first step's update by a
// quarter, far outside the tolerance.
TEST_CASE("random CNNs under AdamW, Adam and RMSprop: the fused step's update rule follows the CPU and per-launch") {
  SG_SKIP_IF_CORE_ONLY("the fused CNN step");
  struct Case {
    OptimizerKind kind;
    std::int64_t batch;
    double momentum;
    bool centered;
  };
  std::mt19937_64 rng(35);
  for (const Case c : {Case{OptimizerKind::adamw, 16, 0.0, false}, Case{OptimizerKind::adam, 64, 0.0, false},
                       Case{OptimizerKind::rmsprop, 33, 0.9, true}, Case{OptimizerKind::rmsprop, 5, 0.0, false}}) {
    RandomCnn r = random_cnn(rng, c.batch);
    OptimizerSpec& o = r.training.optimizer;
    o.kind = c.kind;
    o.lr = 2e-3;
    o.eps = 1e-3;
    o.momentum = c.momentum;
    o.centered = c.centered;
    o.weight_decay = c.kind == OptimizerKind::adamw ? 0.05 : 1e-3;
    CAPTURE(optimizer_name(c.kind));
    CAPTURE(c.momentum);
    CAPTURE(c.centered);
    CAPTURE(r.text);
    const ThreeTrainers t = three_trainers(r, rng);
    Trainer* const fused = t.fused.get();
    Trainer* const per_launch = t.per_launch.get();
    Trainer* const cpu = t.cpu.get();
    INFO(fused->description());
    // The first step: states and changes as the CPU's and the per-launch
    // schedule's. Then two more (bias correction at t = 2 and 3): changes as
    // the per-launch schedule's, which applies the same rule to the same
    // fp16 gradients (the CPU's drift apart faster: with momentum and a
    // centered RMSprop the states differ by a few percent after three steps,
    // both GPU schedules alike). Each trainer's change from its own state before.
    for (int steps : {1, 2}) {
      CAPTURE(steps);
      const auto fused_before = fused->save_state();
      const auto per_launch_before = per_launch->save_state();
      const auto cpu_before = cpu->save_state();
      fused->train(steps);
      per_launch->train(steps);
      cpu->train(steps);
      const std::vector<float> fused_change = state_change(fused_before, fused->save_state());
      CHECK(test::relative_error(fused_change, state_change(per_launch_before, per_launch->save_state())) < 3e-2);
      if (steps == 1) {
        CHECK(test::relative_error(fused_change, state_change(cpu_before, cpu->save_state())) < 3e-2);
        check_same_state(*fused, *cpu, 1e-2);
      }
    }
    for (int step = 4; step <= 12; ++step) {
      fused->train(1);
      cpu->train(1);
      CAPTURE(step);
      REQUIRE(std::isfinite(fused->last_loss()));
      CHECK(std::abs(fused->last_loss() - cpu->last_loss()) < 2e-2 * std::abs(cpu->last_loss()) + 1e-3);
    }
  }
}
