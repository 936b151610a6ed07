#pragma once
// Helpers of the training-step tests: a random u8 dataset of any width, the
// loss of each of n steps, every parameter as one flat vector, and a
// bit-for-bit comparison of two trainers' saved state.
#include <doctest/doctest.h>

#include <random>
#include <vector>

#include "runtime/tensor_blob.hpp"
#include "runtime/trainer.hpp"

namespace sg::test {

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
    if (blob.dtype == DType::f16 || blob.dtype == DType::f32) {
      const auto v = floats_from_blob(blob);
      out.insert(out.end(), v.begin(), v.end());
    }
  return out;
}

// Every entry of the two trainers' saved state (parameters, optimizer state,
// step, shuffle) is bit-identical.
inline void check_same_state(Trainer& a, Trainer& b) {
  const auto x = a.save_state(), y = b.save_state();
  REQUIRE(x.size() == y.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    INFO("entry " << x[i].name);
    CHECK(x[i] == y[i]);
  }
}

}  // namespace sg::test
