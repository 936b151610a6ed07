#pragma once
// Training steps of a model.sequential training graph on the CPU reference
// in f64: the spec's initial parameters (seed 3), random u8 images and labels
// of 4 classes from `data_seed`, the batches in dataset order; returns every
// parameter, then the optimizer's and batch_norm's running state, as one
// vector. For tests that compare two graphs of one network step by step;
// sequential_training_stages makes them from a forward graph.
#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "graph/training_graph.hpp"
#include "models/mlp_program.hpp"
#include "models/sequential.hpp"
#include "runtime/cpu/cpu_executor.hpp"

namespace sg::test {

// The training stages of a model.sequential forward graph (its loss and step counter named as the builders name them).
inline TrainingGraphStages sequential_training_stages(Graph forward, const OptimizerSpec& optimizer) {
  const ValueId loss = forward.value_named(names::loss);
  const ValueId step = forward.value_named(names::step);
  return build_training_stages(std::move(forward), loss, optimizer, {}, step);
}

inline std::vector<double> sequential_cpu_steps(const Graph& g, const SequentialSpec& spec, double lr, int steps,
                                                std::uint64_t data_seed) {
  const DataBindings d = mlp_data_bindings(g, spec.batch);
  CpuExecutor<double> e(g);
  std::mt19937_64 rng(data_seed);
  for (auto& v : e.tensor(d.images).u8) v = static_cast<std::uint8_t>(rng() % 256);
  for (auto& v : e.tensor(d.labels).u8) v = static_cast<std::uint8_t>(rng() % 4);
  auto& perm = e.tensor(d.perm).i32;
  std::iota(perm.begin(), perm.end(), 0);
  for (const auto& init : sequential_initial_parameters(spec.input_shape, spec.layers, 3))
    std::copy(init.values.begin(), init.values.end(), e.tensor(init.name).real.begin());
  e.set_learning_rate(lr);
  for (int i = 0; i < steps; ++i) e.run();
  std::vector<double> out;
  for (const Role role : {Role::param, Role::state})
    for (ValueId p : g.values_with_role(role)) {
      const auto& v = e.tensor(p).real;
      out.insert(out.end(), v.begin(), v.end());
    }
  return out;
}

}  // namespace sg::test
