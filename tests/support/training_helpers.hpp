#pragma once
// Helpers of the training-step tests: an MLP trainer setup made into a
// TrainerSpec for a dataset, a random u8 dataset of any width, the loss of
// each of n steps, every parameter as one flat vector, a bit-for-bit
// comparison of two trainers' saved state, a GPU-against-CPU one (states
// close, losses following), a run of one-step trainings with two saved
// states compared entry by entry, and a CPU resume check.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "models/mlp_program.hpp"
#include "runtime/tensor_blob.hpp"
#include "runtime/trainer.hpp"
#include "tests/runtime/test_support.hpp"

namespace sg::test {

// What a training test describes: the MLP setup (models/) and the trainer's
// options. cpu_spec / cuda_spec build the program for a dataset's rows.
struct MlpTrainerSpec {
  MlpSpec mlp;
  OptimizerSpec optimizer;
  FusionOptions fusion;
  std::int64_t eval_batch = 1000;
  std::uint64_t init_seed = 0;
  std::uint64_t shuffle_seed = 1;
  bool cuda_graph = true;
  BackendOptions backend;
};

inline TrainerSpec trainer_spec(const MlpTrainerSpec& s, const Dataset& data, ProgramTarget target) {
  TrainerSpec t;
  t.program = build_mlp_program({s.mlp, s.optimizer, s.fusion, s.eval_batch, s.init_seed}, data.train.images.count,
                                data.test.images.count, target);
  t.shuffle_seed = s.shuffle_seed;
  t.cuda_graph = s.cuda_graph;
  t.backend = s.backend;
  return t;
}
inline TrainerSpec cpu_spec(const MlpTrainerSpec& s, const Dataset& data) {
  return trainer_spec(s, data, ProgramTarget::cpu);
}
inline TrainerSpec cuda_spec(const MlpTrainerSpec& s, const Dataset& data) {
  return trainer_spec(s, data, ProgramTarget::cuda);
}

// Random u8 "images" of an odd width, so nothing is special-cased for 784.
inline Dataset random_dataset(std::int64_t rows, std::int64_t cols, std::int64_t classes, std::mt19937_64& rng) {
  auto split = [&](std::int64_t n) {
    data::Split s;
    s.images.count = n;
    s.images.rows = 1;
    s.images.cols = cols;
    s.images.pixels.resize(static_cast<std::size_t>(n * cols));
    for (auto& p : s.images.pixels) p = static_cast<std::uint8_t>(rng() % 256);
    s.labels.labels.resize(static_cast<std::size_t>(n));
    for (auto& l : s.labels.labels) l = static_cast<std::uint8_t>(rng() % static_cast<std::uint64_t>(classes));
    s.classes = classes;
    return s;
  };
  return {split(rows), split(rows / 2)};
}

inline std::vector<float> losses(Trainer& t, int steps) {
  std::vector<float> out;
  for (int i = 0; i < steps; ++i) {
    t.train(1);
    out.push_back(static_cast<float>(t.last_loss()));
  }
  return out;
}

inline std::vector<float> all_parameters(Trainer& t) {
  std::vector<float> out;
  for (const auto& blob : t.save_state())
    if (is_floating(blob.dtype)) {
      const auto v = floats_from_blob(blob);
      out.insert(out.end(), v.begin(), v.end());
    }
  return out;
}

// Every entry of two saved states (parameters, optimizer state, step,
// shuffle) is bit-identical.
inline void check_same_state(const std::vector<io::TensorBlob>& x, const std::vector<io::TensorBlob>& y) {
  REQUIRE(x.size() == y.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    INFO("entry " << x[i].name);
    CHECK(x[i] == y[i]);
  }
}
// The same for the two trainers' states now.
inline void check_same_state(Trainer& a, Trainer& b) { check_same_state(a.save_state(), b.save_state()); }

// Every floating entry of two trainers' states (parameters, optimizer state)
// within `tolerance` relative error by norm (NaN never passes), or, where
// `floor` > 0, within `floor` by the norm of the difference (an entry that is
// zero but for rounding: a conv bias before batch_norm gets no gradient). For
// a GPU trainer against the CPU backend after a step.
inline void check_states_close(Trainer& a, Trainer& b, double tolerance, double floor = 0.0) {
  const auto x = a.save_state();
  const auto y = b.save_state();
  REQUIRE(x.size() == y.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (x[i].dtype == DType::i32) continue;  // the step counter
    CAPTURE(x[i].name);
    const auto u = floats_from_blob(x[i]), v = floats_from_blob(y[i]);
    double difference = 0.0;
    for (std::size_t k = 0; k < u.size(); ++k) difference += (double(u[k]) - v[k]) * (double(u[k]) - v[k]);
    const double relative = relative_error(u, v);
    CAPTURE(std::sqrt(difference));
    CAPTURE(relative);
    CHECK((relative < tolerance || std::sqrt(difference) < floor));
  }
}

// What `steps` one-step trainings of `t` leave: each step's loss, the state
// after the first step and after the last, the trainer's description and its
// evaluation at the end.
struct StepsRun {
  std::vector<double> losses;
  std::vector<io::TensorBlob> first_state;
  std::vector<io::TensorBlob> state;
  std::string description;
  EvalResult eval;
};
inline StepsRun run_steps(Trainer& t, int steps) {
  StepsRun r;
  r.description = t.description();
  for (int i = 0; i < steps; ++i) {
    t.train(1);
    r.losses.push_back(t.last_loss());
    if (i == 0) r.first_state = t.save_state();
  }
  r.state = t.save_state();
  r.eval = t.evaluate();
  return r;
}

// Two saved states entry by entry: the same names and shapes, the integer
// entries (the step counter) equal, every floating entry named in `only`
// (all when empty) within `tolerance` relative error by norm (NaN never passes).
inline void check_saved_states_close(const std::vector<io::TensorBlob>& x, const std::vector<io::TensorBlob>& y,
                                     double tolerance, const std::set<std::string>& only = {}) {
  REQUIRE(x.size() == y.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    CAPTURE(x[i].name);
    REQUIRE(x[i].name == y[i].name);
    REQUIRE(x[i].shape == y[i].shape);
    if (x[i].dtype == DType::i32) {
      CHECK(x[i] == y[i]);  // the step counter
      continue;
    }
    if (!only.empty() && !only.count(x[i].name)) continue;
    CHECK(relative_error(floats_from_blob(x[i]), floats_from_blob(y[i])) < tolerance);
  }
}

// `steps` more steps of both trainers, each step's loss of `a` within
// `tolerance` of `b`'s (relative, plus 1e-3 absolute) and finite.
inline void check_losses_follow(Trainer& a, Trainer& b, int steps, double tolerance) {
  for (int step = 1; step <= steps; ++step) {
    a.train(1);
    b.train(1);
    CAPTURE(step);
    REQUIRE(std::isfinite(a.last_loss()));
    CHECK(std::abs(a.last_loss() - b.last_loss()) < tolerance * std::abs(b.last_loss()) + 1e-3);
  }
}

// A CPU run of `steps` steps straight, and one of `split` steps saved, loaded
// into a fresh trainer and continued to `steps`: both end in the same state
// and loss (checked here). Returns the straight trainer and the saved state.
struct CpuResumeRun {
  std::unique_ptr<Trainer> straight;
  std::vector<io::TensorBlob> saved;  // after `split` steps
};
inline CpuResumeRun check_cpu_resume(const MlpTrainerSpec& spec, const Dataset& data, int steps, int split) {
  CpuResumeRun run{make_cpu_trainer(cpu_spec(spec, data), data), {}};
  run.straight->train(steps);
  auto first_half = make_cpu_trainer(cpu_spec(spec, data), data);
  first_half->train(split);
  run.saved = first_half->save_state();
  auto resumed = make_cpu_trainer(cpu_spec(spec, data), data);
  resumed->load_state(run.saved);
  CHECK(resumed->step() == split);
  resumed->train(steps - split);
  check_same_state(*run.straight, *resumed);
  CHECK(run.straight->last_loss() == resumed->last_loss());
  return run;
}

}  // namespace sg::test
