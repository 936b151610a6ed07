// An fp32 master weight's compute copy written by its update for the next
// step (runtime/cuda/lowerings/carried_copies.hpp) on the GPU: the kernel's
// copies are the cast op's bits of the updated masters (copies poisoned
// first, both element paths, f16 and bf16); in training, every carried copy
// equals the cast of its master after any number of steps, graph replay,
// stream launches and K steps per graph agree bit for bit, the steps follow
// the CPU backend, and a resume refills the copies from the loaded masters.
#include <doctest/doctest.h>

#include <cstring>
#include <type_traits>
#include <numeric>

#include "ops/cpu/reference_ops.hpp"
#include "ops/cuda/update_rules/multi_tensor_update.hpp"
#include "runtime/cuda/cuda_program.hpp"
#include "runtime/cuda/cuda_trainer.hpp"
#include "tests/cuda_backend/adamw_spec.hpp"
#include "tests/cuda_backend/launch_paths_check.hpp"
#include "tests/runtime/test_support.hpp"
#include "tests/support/device_array.hpp"
#include "tests/support/training_helpers.hpp"

using namespace sg;
using sg::test::DeviceArray;

namespace {

// The update's copy is from_float<C> of the new master: on the host, the same round to nearest.
template <typename C>
float rounded(float x) {
  return static_cast<float>(static_cast<C>(x));
}

// G: the gradient's type, also the copy's (f16 or bf16).
template <typename G>
void check_copies_of_update(std::mt19937_64& rng) {
  std::vector<std::size_t> sizes = {1 + rng() % 5001, 4 * (1 + rng() % 3000)};  // scalar and vector paths
  sizes.push_back((std::size_t(1) << 20) + 4 * (rng() % 2000));                // the larger chunks a block
  const cuda::AdamHyper hyper{0.9f, 0.999f, 1e-8f, 0.01f, true};
  auto scalars = sg::test::device_update_scalars({cuda::make_update_scalars(1e-3f, 0.f, hyper.weight_decay)});
  DeviceArray<float> step_counter(1);
  SG_CUDA_CHECK(cudaMemset(step_counter.get(), 0, 4));
  std::vector<std::unique_ptr<DeviceArray<float>>> w, m, v;
  std::vector<std::unique_ptr<DeviceArray<G>>> g, copy;
  std::vector<cuda::UpdateTensor<float, G>> tensors;
  const auto type = std::is_same_v<G, __half> ? cuda::CopyType::f16 : cuda::CopyType::bf16;
  for (std::size_t n : sizes) {
    std::vector<float> host(n);
    sg::test::fill_uniform(host, rng, -1, 1);
    w.push_back(std::make_unique<DeviceArray<float>>(host));
    sg::test::fill_uniform(host, rng, -2, 2);
    g.push_back(std::make_unique<DeviceArray<G>>(host));
    m.push_back(std::make_unique<DeviceArray<float>>(std::vector<float>(n, 0.f)));
    v.push_back(std::make_unique<DeviceArray<float>>(std::vector<float>(n, 0.f)));
    copy.push_back(std::make_unique<DeviceArray<G>>(n));  // NaN until written
    tensors.push_back({w.back()->get(), g.back()->get(), {m.back()->get(), v.back()->get()}, std::int64_t(n), {},
                       {copy.back()->get(), type}});
  }
  cuda::MultiTensorUpdate<cuda::AdamRule, float, G> adam(tensors, hyper);
  for (int launch = 0; launch < 2; ++launch) {
    adam.launch(scalars.as<cuda::UpdateScalars>(), reinterpret_cast<std::int32_t*>(step_counter.get()), nullptr,
                reinterpret_cast<std::int32_t*>(step_counter.get()), nullptr);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      INFO("launch " << launch << ", tensor of " << sizes[i] << " elements");
      const auto master = w[i]->download(), copied = copy[i]->download();
      std::size_t wrong = 0;
      for (std::size_t k = 0; k < master.size(); ++k) wrong += !(copied[k] == rounded<G>(master[k]));  // NaN: wrong
      CHECK(wrong == 0);
    }
  }
}

sg::test::MlpTrainerSpec adamw_f32(std::vector<std::int64_t> layers, std::int64_t batch) {
  return sg::test::adamw_spec(std::move(layers), batch, DType::f32, 0.0);
}

std::vector<ValueId> carried_values(const cuda::CudaTrainer& t) {
  std::vector<ValueId> out;
  for (const Launch& l : t.training_program().schedule().launches)
    out.insert(out.end(), l.carries.begin(), l.carries.end());
  return out;
}

// Every carried copy holds the f16 rounding of its master now; returns how many were checked.
std::size_t check_copies_match_masters(const cuda::CudaTrainer& t) {
  t.synchronize();
  const auto& program = t.training_program();
  const Graph& g = program.graph();
  for (ValueId copy : carried_values(t)) {
    const ValueId master = g.node(g.value(copy).producer).inputs[0];
    CAPTURE(g.value(master).name);
    REQUIRE(g.value(copy).dtype == DType::f16);
    const auto n = static_cast<std::size_t>(element_count(g.value(master).shape));
    std::vector<float> w(n);
    std::vector<__half> c(n);
    SG_CUDA_CHECK(cudaMemcpy(w.data(), program.device_ptr(master), n * 4, cudaMemcpyDeviceToHost));
    SG_CUDA_CHECK(cudaMemcpy(c.data(), program.device_ptr(copy), n * 2, cudaMemcpyDeviceToHost));
    std::size_t wrong = 0;
    for (std::size_t k = 0; k < n; ++k) wrong += !(static_cast<float>(c[k]) == rounded<__half>(w[k]));
    CHECK(wrong == 0);
  }
  return carried_values(t).size();
}

}  // namespace

TEST_CASE("the multi-tensor update writes each compute copy as the cast of the updated master (f16 and bf16)") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  check_copies_of_update<__half>(rng);
  check_copies_of_update<__nv_bfloat16>(rng);
}

TEST_CASE("AdamW with fp32 masters: the carried copies are the masters' casts after every step, the steps follow "
          "the CPU backend, and the launch paths agree bit for bit") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  const Dataset data = sg::test::random_dataset(400, 64, 10, rng);
  // W2 [999, 1201]: over 2^20 elements (the smaller parameters' casts stay a launch), odd: the
  // kernel's element-by-element path.
  const auto spec = adamw_f32({64, 1201, 999, 10}, 33);
  cuda::CudaTrainer gpu(sg::test::cuda_spec(spec, data), data);
  const std::size_t copies = carried_values(gpu).size();
  REQUIRE(copies == 1);
  auto cpu = make_cpu_trainer(sg::test::cpu_spec(spec, data), data);
  gpu.poison_activations();  // (refills the copies: they live in the arena)
  CHECK(check_copies_match_masters(gpu) == copies);
  std::vector<float> gl, cl;
  for (int round = 0; round < 4; ++round) {
    for (float l : sg::test::losses(gpu, 1 + round * 5)) gl.push_back(l);  // 1, 6, 11, 16 steps: 34 in all
    check_copies_match_masters(gpu);
  }
  cl = sg::test::losses(*cpu, static_cast<int>(gl.size()));
  MESSAGE("loss step 1 gpu " << gl.front() << " cpu " << cl.front() << ", step " << gl.size() << " gpu " << gl.back()
                             << " cpu " << cl.back());
  CHECK(sg::test::relative_error(gl, cl) < 2e-2);
  CHECK(std::accumulate(gl.end() - 10, gl.end(), 0.0) < std::accumulate(gl.begin(), gl.begin() + 10, 0.0));
  sg::test::check_launch_paths_agree(spec, data, 41, 4, [&](cuda::CudaTrainer& replay) {
    CHECK(check_copies_match_masters(replay) == copies);
  });
}

TEST_CASE("AdamW with fp32 masters resumes bit-exactly: loading a state refills the carried copies") {
  auto rng = sg::test::fresh_rng();
  const Dataset data = sg::test::random_dataset(400, 64, 10, rng);
  const auto spec = adamw_f32({64, 1201, 999, 10}, 33);
  cuda::CudaTrainer straight(sg::test::cuda_spec(spec, data), data);
  straight.train(50);
  cuda::CudaTrainer first(sg::test::cuda_spec(spec, data), data);
  first.train(23);
  const auto saved = first.save_state();
  cuda::CudaTrainer resumed(sg::test::cuda_spec(spec, data), data);
  resumed.train(5);  // its copies now hold other masters' casts
  resumed.load_state(saved);
  CHECK(check_copies_match_masters(resumed) == 1);
  resumed.train(27);
  sg::test::check_same_state(straight, resumed);
  CHECK(straight.last_loss() == resumed.last_loss());
}
