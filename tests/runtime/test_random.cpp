// The project's RNG: permutations and initial weights.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "models/mlp.hpp"
#include "models/param_init.hpp"
#include "runtime/epoch_schedule.hpp"
#include "runtime/random.hpp"

using namespace sg;

TEST_CASE("epoch permutations are permutations, reproducible, and differ between epochs") {
  const auto a = epoch_permutation(1000, 7, 0);
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < 1000; ++i) CHECK(sorted[static_cast<std::size_t>(i)] == i);
  CHECK(a == epoch_permutation(1000, 7, 0));
  CHECK(a != epoch_permutation(1000, 7, 1));
  CHECK(a != epoch_permutation(1000, 8, 0));
  int fixed_points = 0;
  for (int i = 0; i < 1000; ++i) fixed_points += a[static_cast<std::size_t>(i)] == i;
  CHECK(fixed_points < 10);  // a shuffle, not the identity (expected about 1)
}

TEST_CASE("the epoch schedule hands out a new permutation only at epoch boundaries") {
  EpochSchedule s(100, 30, 1);  // 3 batches per epoch
  CHECK(s.batches_per_epoch() == 3);
  CHECK(s.permutation_if_changed(0).has_value());
  CHECK_FALSE(s.permutation_if_changed(2).has_value());
  CHECK(s.steps_left_in_epoch(2) == 1);
  const auto next = s.permutation_if_changed(3);
  REQUIRE(next.has_value());
  CHECK(*next == epoch_permutation(100, 1, 1));
}

TEST_CASE("initial parameters follow nn.Linear's U(-1/sqrt(fan_in), 1/sqrt(fan_in))") {
  const auto params = mlp_initial_parameters({784, 128, 10}, 3);
  REQUIRE(params.size() == 4);
  CHECK(params[0].name == "w1");
  CHECK(params[0].shape == Shape{128, 784});
  CHECK(params[3].shape == Shape{10});
  for (const auto& p : params) {
    const double bound = 1.0 / std::sqrt(p.name == "w1" || p.name == "b1" ? 784.0 : 128.0);
    const auto [lo, hi] = std::minmax_element(p.values.begin(), p.values.end());
    CHECK(*lo >= -bound);
    CHECK(*hi <= bound);
    if (p.values.size() > 1000) {
      CHECK(*lo < -0.95 * bound);  // the whole range is used
      CHECK(*hi > 0.95 * bound);
    }
  }
  CHECK(params[0].values != mlp_initial_parameters({784, 128, 10}, 4)[0].values);
}

TEST_CASE("the C++ streams agree with bench/stepgraph_data.py (an independent Python implementation)") {
  // Printed by `python3 bench/stepgraph_data.py --selftest`.
  CHECK(epoch_permutation(10, 1, 0) == std::vector<std::int32_t>{2, 5, 4, 0, 7, 9, 1, 3, 6, 8});
  const auto big = epoch_permutation(60000, 1, 0);
  CHECK(std::vector<std::int32_t>(big.begin(), big.begin() + 5) == std::vector<std::int32_t>{31496, 16882, 823, 27913, 11629});
  const auto w = linear_init(5, 784, param_key(0, 0));
  const std::vector<float> python{-0.023141959682106972f, -0.002923763357102871f, 0.0018013365333899856f,
                                  -0.01001272164285183f, 0.0036066139582544565f};
  CHECK(w == python);
}
