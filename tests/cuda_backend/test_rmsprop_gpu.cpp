// RMSprop on the GPU (issue 35): the rule through each update kernel (the
// multi-tensor update, the bias gradient's column sums, the weight gradient's
// tile) against ref::rmsprop_update for every variant (plain, momentum,
// centered, weight decay, clip scale), the tile and the multi-tensor launch
// bit for bit, and MLP training steps against the CPU backend in f32, f16 and
// bf16 and with clipping. Outputs start poisoned; NaN never passes
// (relative_error).
#include <doctest/doctest.h>

#include <map>
#include <numeric>
#include <string>
#include <type_traits>

#include "ops/cpu/reference_ops.hpp"
#include "ops/cuda/fast_paths/fused_update/bias_grad_update.hpp"
#include "ops/cuda/fast_paths/fused_update/wgrad_update.hpp"
#include "ops/cuda/update_rules/multi_tensor_update.hpp"
#include "runtime/cuda/cuda_program.hpp"
#include "runtime/cuda/cuda_trainer.hpp"
#include "runtime/plan/schedule.hpp"
#include "tests/runtime/test_support.hpp"
#include "tests/support/core_only_skips.hpp"
#include "tests/support/device_array.hpp"
#include "tests/support/training_helpers.hpp"

using namespace sg;
using sg::test::DeviceArray;

namespace {

std::vector<double> as_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

struct Variant {
  const char* name;
  cuda::RmspropHyper hyper;
};

// alpha, eps, weight decay, momentum, centered.
const Variant kVariants[] = {{"plain", {0.99f, 1e-8f, 0.f, 0.f, false}},
                             {"momentum", {0.9f, 1e-6f, 0.f, 0.9f, false}},
                             {"centered", {0.95f, 1e-6f, 0.f, 0.f, true}},
                             {"weight decay, momentum, centered", {0.9f, 1e-6f, 0.02f, 0.5f, true}}};

// The host state of one tensor: W (as double), square_avg, momentum_buf, grad_avg.
struct HostState {
  std::vector<double> w, sq, buf, avg;
  void reference_step(const std::vector<double>& g, const cuda::RmspropHyper& h, double lr, double scale) {
    ref::rmsprop_update(w.data(), g.data(), sq.data(), buf.data(), avg.data(), std::int64_t(w.size()), lr,
                        double(h.alpha), double(h.eps), double(h.weight_decay), double(h.momentum), h.centered,
                        scale);
  }
};

// Device state slots, each present only where the rule uses it.
struct DeviceSlots {
  std::unique_ptr<DeviceArray<float>> sq, buf, avg;
  DeviceSlots(const HostState& s, const cuda::RmspropHyper& h)
      : sq(std::make_unique<DeviceArray<float>>(std::vector<float>(s.sq.begin(), s.sq.end()))) {
    if (h.momentum > 0) buf = std::make_unique<DeviceArray<float>>(std::vector<float>(s.buf.begin(), s.buf.end()));
    if (h.centered) avg = std::make_unique<DeviceArray<float>>(std::vector<float>(s.avg.begin(), s.avg.end()));
  }
  cuda::StateSlots slots() const { return {{sq->get(), buf ? buf->get() : nullptr, avg ? avg->get() : nullptr}}; }
  void check(const HostState& s, const cuda::RmspropHyper& h, double tol) const {
    CHECK(sg::test::relative_error(sq->download(), s.sq) < tol);
    if (h.momentum > 0) CHECK(sg::test::relative_error(buf->download(), s.buf) < tol);
    if (h.centered) CHECK(sg::test::relative_error(avg->download(), s.avg) < tol);
  }
};

HostState random_state(std::size_t n, std::mt19937_64& rng) {
  HostState s;
  s.sq = as_double(sg::test::uniform(n, rng, 0.01f, 0.1f));  // square_avg >= grad_avg^2 (centered stays real)
  s.buf = as_double(sg::test::uniform(n, rng, -0.1f, 0.1f));
  s.avg = as_double(sg::test::uniform(n, rng, -0.05f, 0.05f));
  return s;
}

template <typename W, typename G>
void check_multi_tensor(std::mt19937_64& rng, const cuda::RmspropHyper& h, bool clip) {
  INFO("W " << sizeof(W) << " bytes, G " << sizeof(G) << " bytes, clip " << clip);
  std::vector<std::size_t> sizes{1 + rng() % 9000, 4 * (1 + rng() % 3000)};  // the scalar and the vector path
  const float lr = 0.003f, scale = 0.37f;
  auto scalars = sg::test::device_update_scalars({cuda::make_update_scalars(lr, 0.f, h.weight_decay)});
  DeviceArray<float> clip_scale(std::vector<float>{scale});
  std::vector<HostState> host;
  std::vector<std::vector<double>> grads;
  std::vector<std::unique_ptr<DeviceArray<W>>> w;
  std::vector<std::unique_ptr<DeviceArray<G>>> g;
  std::vector<DeviceSlots> slots;
  std::vector<cuda::UpdateTensor<W, G>> tensors;
  for (std::size_t n : sizes) {
    host.push_back(random_state(n, rng));
    host.back().w = as_double(sg::test::representable<W>(sg::test::uniform(n, rng)));
    grads.push_back(as_double(sg::test::representable<G>(sg::test::uniform(n, rng, -2.f, 2.f))));
    w.push_back(std::make_unique<DeviceArray<W>>(std::vector<float>(host.back().w.begin(), host.back().w.end())));
    g.push_back(std::make_unique<DeviceArray<G>>(std::vector<float>(grads.back().begin(), grads.back().end())));
    slots.emplace_back(host.back(), h);
    tensors.push_back({w.back()->get(), g.back()->get(), slots.back().slots(), std::int64_t(n)});
  }
  cuda::MultiTensorUpdate<cuda::RmspropRule, W, G> update(tensors, h);
  for (int launch = 0; launch < 2; ++launch) {  // the state carried between launches
    update.launch(scalars.as<cuda::UpdateScalars>(), nullptr, clip ? clip_scale.get() : nullptr, nullptr, nullptr);
    for (std::size_t i = 0; i < sizes.size(); ++i) host[i].reference_step(grads[i], h, double(lr), clip ? double(scale) : 1.0);
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    INFO("tensor " << i << ", " << sizes[i] << " elements");
    // Two roundings of W to its type: bf16 keeps 8 significant bits, f16 11.
    const double w_tol = std::is_same_v<W, __nv_bfloat16> ? 8e-3 : sizeof(W) == 2 ? 3e-3 : 1e-5;
    CHECK(sg::test::relative_error(w[i]->download(), host[i].w) < w_tol);
    slots[i].check(host[i], h, 1e-4);
  }
}

}  // namespace

TEST_CASE("multi-tensor RMSprop equals the CPU reference (every variant, f32, f16 and bf16, with and without clipping)") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  for (const Variant& v : kVariants)
    for (bool clip : {false, true}) {
      INFO(v.name);
      check_multi_tensor<float, float>(rng, v.hyper, clip);
      check_multi_tensor<__half, __half>(rng, v.hyper, clip);
      check_multi_tensor<float, __half>(rng, v.hyper, clip);
      check_multi_tensor<__nv_bfloat16, __nv_bfloat16>(rng, v.hyper, clip);
      check_multi_tensor<float, __nv_bfloat16>(rng, v.hyper, clip);
    }
}

TEST_CASE("bias gradient + RMSprop in one kernel equals reduce_rows + the CPU reference") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  for (const Variant& v : kVariants)
    for (std::int64_t rows : {33, 300}) {  // 8 and 32 chains
      const std::int64_t cols = 1 + static_cast<std::int64_t>(rng() % 1500);
      INFO(v.name << ", rows " << rows << " cols " << cols);
      const auto dy = sg::test::representable<__half>(sg::test::uniform(std::size_t(rows * cols), rng));
      HostState s = random_state(std::size_t(cols), rng);
      s.w = as_double(sg::test::uniform(std::size_t(cols), rng));
      DeviceArray<__half> dy_d(dy);
      DeviceArray<float> b_d(std::vector<float>(s.w.begin(), s.w.end()));
      DeviceSlots slots(s, v.hyper);
      auto scalars = sg::test::device_update_scalars({cuda::make_update_scalars(0.01f, 0.f, v.hyper.weight_decay)});
      cuda::launch_bias_grad_update<cuda::RmspropRule>(dy_d.get(), rows, cols, b_d.get(), slots.slots(),
                                                       scalars.as<cuda::UpdateScalars>(), nullptr, v.hyper, nullptr);
      std::vector<double> grad(std::size_t(cols), 0.0);
      ref::reduce_rows(as_double(dy).data(), rows, cols, grad.data());
      s.reference_step(grad, v.hyper, 0.01, 1.0);
      // The f32 column sum (fixed order) against double.
      CHECK(sg::test::relative_error(b_d.download(), s.w) < 1e-4);
      slots.check(s, v.hyper, 1e-3);
    }
}

TEST_CASE("weight gradient + RMSprop from the tile equals the CPU reference and the multi-tensor launch bit for bit") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  // Small integer inputs: the tile's fp32 sums and the f64 gradient are the same exact integers.
  const std::int64_t batch = 48, n = 96, k = 136;
  const auto ints = [&](std::size_t count) {
    std::vector<float> out(count);
    for (auto& e : out) e = float(int(rng() % 7) - 3);
    return out;
  };
  for (const Variant& v : kVariants) {
    INFO(v.name);
    const auto dy = ints(std::size_t(batch * n)), x = ints(std::size_t(batch * k));
    std::vector<double> g(std::size_t(n * k));
    ref::matmul(as_double(dy).data(), as_double(x).data(), g.data(), n, k, batch, true, false);
    HostState s = random_state(g.size(), rng);
    s.w = as_double(sg::test::uniform(g.size(), rng));
    auto scalars = sg::test::device_update_scalars({cuda::make_update_scalars(1e-3f, 0.f, v.hyper.weight_decay)});
    DeviceArray<__half> dy_d(dy), x_d(x);
    DeviceArray<float> w_tile(std::vector<float>(s.w.begin(), s.w.end())), w_multi(std::vector<float>(s.w.begin(), s.w.end()));
    DeviceArray<float> g_d(std::vector<float>(g.begin(), g.end()));
    DeviceSlots tile_slots(s, v.hyper), multi_slots(s, v.hyper);
    cuda::launch_wgrad_update<cuda::RmspropRule, float, float>(dy_d.get(), x_d.get(), batch, n, k, w_tile.get(),
                                                               tile_slots.slots(), scalars.as<cuda::UpdateScalars>(),
                                                               nullptr, v.hyper, nullptr);
    cuda::MultiTensorUpdate<cuda::RmspropRule, float, float> multi(
        {{w_multi.get(), g_d.get(), multi_slots.slots(), n * k}}, v.hyper);
    multi.launch(scalars.as<cuda::UpdateScalars>(), nullptr, nullptr, nullptr, nullptr);
    s.reference_step(g, v.hyper, 1e-3, 1.0);
    const auto w_got = w_tile.download();
    CHECK(sg::test::relative_error(w_got, s.w) < 1e-5);
    tile_slots.check(s, v.hyper, 1e-5);
    CHECK(w_got == w_multi.download());
    CHECK(tile_slots.sq->download() == multi_slots.sq->download());
    if (v.hyper.momentum > 0) CHECK(tile_slots.buf->download() == multi_slots.buf->download());
    if (v.hyper.centered) CHECK(tile_slots.avg->download() == multi_slots.avg->download());
  }
}

namespace {

sg::test::MlpTrainerSpec rmsprop_spec(std::vector<std::int64_t> layers, std::int64_t batch, DType compute,
                                      DType weights, double momentum, bool centered, double clip) {
  sg::test::MlpTrainerSpec spec;
  spec.mlp.layers = std::move(layers);
  spec.mlp.batch = batch;
  spec.mlp.compute_dtype = compute;
  spec.mlp.weight_dtype = weights;
  // RMSprop's first step moves a weight by lr / sqrt(1 - alpha) (10 lr) whatever its gradient's size,
  // as Adam moves it by lr: the scale of test_optimizers.cpp's Adam cases (lr 2e-3).
  spec.optimizer.lr = 5e-4;
  spec.optimizer.kind = OptimizerKind::rmsprop;
  spec.optimizer.momentum = momentum;
  spec.optimizer.centered = centered;
  spec.optimizer.weight_decay = 1e-3;
  spec.optimizer.clip_grad_norm = clip;
  spec.eval_batch = 100;
  spec.init_seed = 3;
  spec.shuffle_seed = 5;
  return spec;
}

}  // namespace

TEST_CASE("CUDA RMSprop training steps follow the CPU backend's loss curve (f32, f16, bf16, clipping)") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  const Dataset odd = sg::test::random_dataset(400, 37, 11, rng);
  const Dataset wide = sg::test::random_dataset(640, 784, 10, rng);
  struct Case {
    std::string what;
    sg::test::MlpTrainerSpec spec;
    const Dataset* data;
  };
  const std::vector<Case> cases = {
      {"f32 weights, odd widths", rmsprop_spec({37, 129, 65, 11}, 33, DType::f16, DType::f32, 0.0, false, 0.0), &odd},
      {"f16 weights, momentum, centered", rmsprop_spec({37, 129, 65, 11}, 33, DType::f16, DType::f16, 0.9, true, 0.0), &odd},
      {"bf16 weights, momentum", rmsprop_spec({37, 129, 65, 11}, 33, DType::bf16, DType::bf16, 0.5, false, 0.0), &odd},
      {"f32 weights, clip", rmsprop_spec({37, 129, 65, 11}, 33, DType::f16, DType::f32, 0.9, false, 0.5), &odd},
      {"f16 batch 32 (fused bias updates)", rmsprop_spec({784, 128, 128, 10}, 32, DType::f16, DType::f16, 0.0, false, 0.0), &wide},
      {"fp32 master weights batch 128 (gradient tiles)",
       rmsprop_spec({784, 256, 256, 10}, 128, DType::f16, DType::f32, 0.0, true, 0.0), &wide},
  };
  for (const auto& c : cases) {
    INFO(c.what);
    const Dataset& data = *c.data;
    auto cpu = make_cpu_trainer(sg::test::cpu_spec(c.spec, data), data);
    cuda::CudaTrainer gpu(sg::test::cuda_spec(c.spec, data), data);
    gpu.poison_activations();
    const auto gl = sg::test::losses(gpu, 60);
    const auto cl = sg::test::losses(*cpu, 60);
    MESSAGE(c.what << ": loss step 1 gpu " << gl[0] << " cpu " << cl[0] << ", step 60 gpu " << gl[59] << " cpu " << cl[59]);
    // bf16 keeps 8 significant bits to fp16's 11 (test_bf16_step.cpp's bounds).
    CHECK(sg::test::relative_error(gl, cl) < (c.spec.mlp.compute_dtype == DType::bf16 ? 5e-2 : 2e-2));
    CHECK(std::accumulate(gl.end() - 10, gl.end(), 0.0) < std::accumulate(gl.begin(), gl.begin() + 10, 0.0));
  }
}

TEST_CASE("RMSprop's weight updates take the fused update kernels Adam's take") {
  SG_SKIP_IF_CORE_ONLY("wgrad_update, bias_grad_update");
  auto rng = sg::test::fresh_rng();
  const Dataset wide = sg::test::random_dataset(640, 784, 10, rng);
  const auto spec = rmsprop_spec({784, 256, 256, 10}, 128, DType::f16, DType::f32, 0.0, false, 0.0);
  cuda::CudaTrainer gpu(sg::test::cuda_spec(spec, wide), wide);
  std::map<std::string, int> counts;
  for (const Launch& l : gpu.training_program().schedule().launches) ++counts[std::string(l.lowering->name())];
  // fp32 master weights: each layer's weight and bias from its gradient tile (the classifier's 10
  // rows too); the step's advance then runs alone.
  CHECK(counts["wgrad_update"] == 3);
  CHECK(counts["bias_grad_update"] == 0);
  CHECK(counts["update_multi_tensor"] == 0);
}
