// Issue 37's concat on the CPU backend: inputs joined along dimension 1
// (channels of images, features of vectors) in their order, as torch.cat(xs,
// dim=1); its gradient slices dY back into each input's channels
// (slice_channels); f64 finite differences through a network that joins two
// branches; shape errors.
#include <doctest/doctest.h>

#include "graph/autodiff.hpp"
#include "runtime/cpu/cpu_executor.hpp"
#include "tests/runtime/finite_differences.hpp"
#include "tests/runtime/test_support.hpp"

using namespace sg;

TEST_CASE("concat joins channels in input order, slice_channels takes a block of them back") {
  Graph g;
  const auto a = g.input("a", {2, 1, 2}, DType::f32);  // N=2, C=1, 2 values per channel
  const auto b = g.input("b", {2, 2, 2}, DType::f32);
  const auto y = g.append_node(OpKind::concat, {a, b}, NoAttrs{}).front();
  const auto s = g.append_node(OpKind::slice_channels, {y}, SliceAttrs{1, 2}).front();
  CHECK(g.value(y).shape == Shape{2, 3, 2});
  CHECK(g.value(s).shape == Shape{2, 2, 2});
  CpuExecutor<double> exec(g);
  exec.tensor(a).real = {1, 2, 3, 4};
  exec.tensor(b).real = {10, 11, 12, 13, 20, 21, 22, 23};
  exec.run();
  CHECK(exec.tensor(y).real == std::vector<double>{1, 2, 10, 11, 12, 13, 3, 4, 20, 21, 22, 23});
  CHECK(exec.tensor(s).real == exec.tensor(b).real);
}

TEST_CASE("finite differences: two conv branches and the input joined by concat, and vectors") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  {
    Graph g;
    const auto x = g.param("x", {2, 2, 5, 5}, DType::f32);
    const auto w1 = g.param("w1", {3, 2, 3, 3}, DType::f32);
    const auto w2 = g.param("w2", {2, 2, 1, 1}, DType::f32);
    const auto c1 = g.append_node(OpKind::conv2d, {x, w1}, Conv2dAttrs{1, 1, 0, 0}).front();
    const auto c2 = g.append_node(OpKind::conv2d, {x, w2}, Conv2dAttrs{1, 0, 0, 0}).front();
    const auto joined = g.append_node(OpKind::concat, {g.relu(c1), c2, x}, NoAttrs{}).front();  // 3 + 2 + 2 channels
    CHECK(g.value(joined).shape == Shape{2, 7, 5, 5});
    sg::test::check_gradients_through_mse(g, joined, rng, 0);
  }
  {
    Graph g;
    const auto a = g.param("a", {3, 4}, DType::f32);
    const auto b = g.param("b", {3, 1}, DType::f32);
    sg::test::check_gradients_through_mse(g, g.append_node(OpKind::concat, {a, b, a}, NoAttrs{}).front(), rng, 0);
  }
}

TEST_CASE("concat's and slice_channels' shape errors name the values") {
  Graph g;
  const auto a = g.input("a", {2, 3, 4, 4}, DType::f32);
  const auto b = g.input("b", {2, 3, 5, 4}, DType::f32);
  const auto h = g.input("h", {2, 3, 4, 4}, DType::f16);
  CHECK_THROWS_WITH_AS(g.append_node(OpKind::concat, {a, b}, NoAttrs{}),
                       doctest::Contains("concat: 'a' [2,3,4,4] f32 and 'b' [2,3,5,4] f32 differ beyond dimension 1"),
                       GraphError);
  CHECK_THROWS_AS(g.append_node(OpKind::concat, {a, h}, NoAttrs{}), GraphError);
  CHECK_THROWS_AS(g.append_node(OpKind::concat, {a}, NoAttrs{}), GraphError);
  CHECK_THROWS_WITH_AS(g.append_node(OpKind::slice_channels, {a}, SliceAttrs{2, 2}),
                       doctest::Contains("slice_channels: channels 2..3 are not inside the 3 of 'a'"), GraphError);
}
