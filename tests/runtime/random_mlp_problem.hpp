#pragma once
// A tiny random MLP training problem for the CPU-executor tests: 11-9-7-5 at
// batch 6 over 20 random u8 rows, f32 weights and compute, a shuffled row order.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "models/mlp.hpp"
#include "runtime/cpu/cpu_executor.hpp"

namespace sg::test {

struct MlpProblem {
  MlpSpec spec;
  std::vector<std::uint8_t> images, labels;
  std::vector<std::int32_t> perm;
};

inline MlpProblem random_mlp_problem(std::mt19937_64& rng) {
  MlpProblem p;
  p.spec.layers = {11, 9, 7, 5};
  p.spec.batch = 6;
  p.spec.dataset_rows = 20;
  p.spec.weight_dtype = DType::f32;
  p.spec.compute_dtype = DType::f32;
  p.images.resize(20 * 11);
  p.labels.resize(20);
  for (auto& v : p.images) v = static_cast<std::uint8_t>(rng() % 256);
  for (auto& v : p.labels) v = static_cast<std::uint8_t>(rng() % 5);
  p.perm.resize(20);
  std::iota(p.perm.begin(), p.perm.end(), 0);
  std::shuffle(p.perm.begin(), p.perm.end(), rng);
  return p;
}

// The problem's dataset and row order into an executor of its graph.
template <typename T>
void load_mlp_data(CpuExecutor<T>& exec, const MlpProblem& p) {
  exec.tensor(names::images).u8 = p.images;
  exec.tensor(names::labels).u8 = p.labels;
  exec.tensor(names::perm).i32 = p.perm;
}

}  // namespace sg::test
