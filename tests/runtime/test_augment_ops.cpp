// Issue 37's in-graph augmentation (augment_images) on the CPU backend: each
// example is moved by its Philox draw with fill where pixels come from
// outside, and mirrored first when flip draws it; the draws depend on seed,
// step and the example's global index only (a rank's offset gives the draws
// of the same examples in one process), reach every shift in [-k, k] and
// both flips about evenly, and change with the step; translate 0 without
// flip is the identity. Shape errors.
#include <doctest/doctest.h>

#include <map>

#include "ops/augment_draws.hpp"
#include "runtime/cpu/cpu_executor.hpp"
#include "tests/runtime/test_support.hpp"

using namespace sg;

namespace {

struct Run {
  std::vector<double> x, y;
};

// x [n, c, h, w] holding first + 1, first + 2, ..., augmented at `step` with `a`.
Run augmented(const Shape& shape, const AugmentAttrs& a, std::int32_t step, double first = 0.0) {
  Graph g;
  const auto x = g.input("x", shape, DType::f32);
  const auto s = g.state("step", {1}, DType::i32);
  const auto y = g.append_node(OpKind::augment_images, {x, s}, a).front();
  CpuExecutor<double> exec(g);
  auto& values = exec.tensor(x).real;
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = first + 1.0 + static_cast<double>(i);
  exec.tensor(s).i32.assign(1, step);
  exec.run();
  return {values, exec.tensor(y).real};
}

}  // namespace

TEST_CASE("augment_images moves each example by its draw, fills what comes from outside, flips first") {
  const Shape shape{6, 2, 5, 4};
  const AugmentAttrs a{2, true, -0.5, 0x5eedull, 0};
  const Run r = augmented(shape, a, 7);
  int flipped = 0, moved = 0;
  for (std::int64_t n = 0; n < 6; ++n) {
    const augment::Draw d = augment::draw(a.seed, 7, n, 2, true);
    flipped += d.flip;
    moved += d.dx != 0 || d.dy != 0;
    for (std::int64_t c = 0; c < 2; ++c)
      for (std::int64_t i = 0; i < 5; ++i)
        for (std::int64_t j = 0; j < 4; ++j) {
          // Written out: the source of (i, j) is (i - dy, j - dx) in the (maybe mirrored) image.
          const std::int64_t si = i - d.dy, sj = j - d.dx;
          const bool inside = si >= 0 && si < 5 && sj >= 0 && sj < 4;
          const std::int64_t col = d.flip ? 3 - sj : sj;
          const double expected = inside ? r.x[static_cast<std::size_t>(((n * 2 + c) * 5 + si) * 4 + col)] : -0.5;
          CHECK(r.y[static_cast<std::size_t>(((n * 2 + c) * 5 + i) * 4 + j)] == expected);
        }
  }
  MESSAGE(flipped << " of 6 examples flipped, " << moved << " moved");
  // Translate 0 and no flip: the identity.
  const Run same = augmented(shape, AugmentAttrs{0, false, 0.0, 1, 0}, 3);
  CHECK(same.y == same.x);
}

TEST_CASE("augmentation draws depend on seed, step and global example only, and cover every shift and flip") {
  // A rank whose examples start at 8 (its inputs: examples 8..15 of one
  // process's batch) gives what that process gives for them.
  const Run whole = augmented({16, 1, 6, 6}, AugmentAttrs{2, true, 0.0, 99, 0}, 5);
  const Run rank1 = augmented({8, 1, 6, 6}, AugmentAttrs{2, true, 0.0, 99, 8}, 5, 8 * 36);
  CHECK(rank1.y == std::vector<double>(whole.y.begin() + 8 * 36, whole.y.end()));
  // Step, seed and example all change the draws; the same key gives the same draw.
  int step_changes = 0, seed_changes = 0;
  std::map<int, int> shifts;
  int flips = 0;
  constexpr int kExamples = 4000;
  for (int e = 0; e < kExamples; ++e) {
    const auto d = augment::draw(1, 10, e, 3, true);
    const auto next_step = augment::draw(1, 11, e, 3, true);
    const auto other_seed = augment::draw(2, 10, e, 3, true);
    step_changes += d.dx != next_step.dx || d.dy != next_step.dy || d.flip != next_step.flip;
    seed_changes += d.dx != other_seed.dx || d.dy != other_seed.dy || d.flip != other_seed.flip;
    ++shifts[d.dx];
    ++shifts[100 + d.dy];
    flips += d.flip;
  }
  CHECK(step_changes > kExamples * 8 / 10);
  CHECK(seed_changes > kExamples * 8 / 10);
  for (int s = -3; s <= 3; ++s) {
    CHECK(shifts[s] > kExamples / 7 * 8 / 10);  // each of the 7 shifts about 1/7 of the time
    CHECK(shifts[100 + s] > kExamples / 7 * 8 / 10);
  }
  CHECK(shifts.size() == 14);
  CHECK(flips > kExamples * 4 / 10);
  CHECK(flips < kExamples * 6 / 10);
  // Without flip, nothing is mirrored.
  for (int e = 0; e < 100; ++e) CHECK_FALSE(augment::draw(1, 10, e, 3, false).flip);
}

TEST_CASE("augment_images refuses what it cannot augment, naming the value") {
  Graph g;
  const auto x = g.input("x", {2, 1, 4, 6}, DType::f32);
  const auto s = g.state("step", {1}, DType::i32);
  CHECK_THROWS_WITH_AS(g.append_node(OpKind::augment_images, {x, s}, AugmentAttrs{4, false, 0.0, 1, 0}),
                       doctest::Contains("augment_images: translate 4 must be in [0, 4)"), GraphError);
  CHECK_THROWS_WITH_AS(g.append_node(OpKind::augment_images, {x, x}, AugmentAttrs{1, false, 0.0, 1, 0}),
                       doctest::Contains("must be the i32[1] step counter"), GraphError);
  CHECK_THROWS_AS(g.append_node(OpKind::augment_images, {g.input("v", {2, 24}, DType::f32), s}, AugmentAttrs{}),
                  GraphError);
}
