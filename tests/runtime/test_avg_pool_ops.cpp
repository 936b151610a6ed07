// Issue 37's mean pooling on the CPU backend: avg_pool2d (PyTorch's
// AvgPool2d(kernel, stride), no padding) and global_avg_pool2d
// (AdaptiveAvgPool2d(1)): values worked by hand, f64 finite-difference
// gradients on random shapes (overlapping, exact and gapped windows, planes
// that are not square), the gradient ops' attributes, and shape errors.
#include <doctest/doctest.h>

#include "graph/autodiff.hpp"
#include "runtime/cpu/cpu_executor.hpp"
#include "tests/runtime/finite_differences.hpp"
#include "tests/runtime/test_support.hpp"

using namespace sg;

namespace {

ValueId avg_pool(Graph& g, ValueId x, std::int64_t kernel, std::int64_t stride) {
  return g.append_node(OpKind::avg_pool2d, {x}, Pool2dAttrs{kernel, stride}).front();
}
ValueId global_pool(Graph& g, ValueId x) { return g.append_node(OpKind::global_avg_pool2d, {x}, NoAttrs{}).front(); }

}  // namespace

TEST_CASE("avg_pool2d and global_avg_pool2d compute window and plane means, and their gradients spread dY evenly") {
  Graph g;
  const auto x = g.input("x", {1, 1, 3, 5}, DType::f32);
  const auto y = avg_pool(g, x, 2, 2);     // windows at columns 0-1 and 2-3 of rows 0-1; row 2, column 4 unused
  const auto m = global_pool(g, x);
  const auto dy = g.input("dy", {1, 1, 1, 2}, DType::f32);
  const auto dm = g.input("dm", {1, 1, 1, 1}, DType::f32);
  const auto dx = g.append_node(OpKind::avg_pool2d_backward, {dy}, Pool2dAttrs{2, 2, 3, 5}).front();
  const auto dxm = g.append_node(OpKind::global_avg_pool2d_backward, {dm}, ReshapeAttrs{{1, 1, 3, 5}}).front();
  CHECK(g.value(y).shape == Shape{1, 1, 1, 2});
  CHECK(g.value(m).shape == Shape{1, 1, 1, 1});
  CHECK(g.value(dx).shape == Shape{1, 1, 3, 5});
  CpuExecutor<double> exec(g);
  exec.tensor(x).real = {1, 3, 5, 7, 100,  //
                         2, 4, 6, 8, 100,  //
                         9, 9, 9, 9, 100};
  exec.tensor(dy).real = {4, 8};
  exec.tensor(dm).real = {30};
  exec.run();
  CHECK(exec.tensor(y).real == std::vector<double>{2.5, 6.5});
  CHECK(exec.tensor(m).real == std::vector<double>{(16 + 20 + 36 + 300) / 15.0});
  CHECK(exec.tensor(dx).real == std::vector<double>{1, 1, 2, 2, 0,  //
                                                    1, 1, 2, 2, 0,  //
                                                    0, 0, 0, 0, 0});
  CHECK(exec.tensor(dxm).real == std::vector<double>(15, 2.0));

  // Overlapping windows (stride 1) add their shares where they overlap.
  Graph g2;
  const auto dy2 = g2.input("dy", {1, 1, 1, 2}, DType::f32);
  const auto dx2 = g2.append_node(OpKind::avg_pool2d_backward, {dy2}, Pool2dAttrs{2, 1, 2, 3}).front();
  CpuExecutor<double> e2(g2);
  e2.tensor(dy2).real = {4, 8};
  e2.run();
  CHECK(e2.tensor(dx2).real == std::vector<double>{1, 3, 2,  //
                                                   1, 3, 2});
}

TEST_CASE("autodiff of avg_pool2d / global_avg_pool2d emits their backwards with the input's size") {
  Graph g;
  const auto x = g.param("x", {2, 3, 7, 6}, DType::f32);
  const auto y = global_pool(g, avg_pool(g, x, 3, 2));  // 7x6 -> 3x2 -> 1x1
  const auto loss = g.append_node(OpKind::mse_loss, {g.flatten(y), g.input("t", {2, 3}, DType::f32)}, NoAttrs{});
  append_backward(g, loss.front());
  int avg_backwards = 0, global_backwards = 0;
  for (const Node& n : g.nodes()) {
    if (n.op == OpKind::avg_pool2d_backward) {
      ++avg_backwards;
      CHECK(n.attr<Pool2dAttrs>() == Pool2dAttrs{3, 2, 7, 6});
      CHECK(n.inputs.size() == 1);  // no X: the mean's gradient does not read it
    }
    if (n.op == OpKind::global_avg_pool2d_backward) {
      ++global_backwards;
      CHECK(n.attr<ReshapeAttrs>().shape == Shape{2, 3, 3, 2});
    }
  }
  CHECK(avg_backwards == 1);
  CHECK(global_backwards == 1);
}

TEST_CASE("finite differences: avg_pool2d on random shapes, kernels and strides") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  for (int trial = 0; trial < 8; ++trial) {
    const std::int64_t kernel = sg::test::pick(rng, 1, 4), stride = sg::test::pick(rng, 1, 4);
    const Shape shape{sg::test::pick(rng, 1, 3), sg::test::pick(rng, 1, 3), kernel + sg::test::pick(rng, 0, 5),
                      kernel + sg::test::pick(rng, 0, 5)};
    CAPTURE(shape_string(shape));
    CAPTURE(kernel);
    CAPTURE(stride);
    Graph g;
    const auto x = g.param("x", shape, DType::f32);
    sg::test::check_gradients_through_mse(g, avg_pool(g, x, kernel, stride), rng, 0);
  }
}

TEST_CASE("finite differences: global_avg_pool2d, alone and after conv, relu and avg_pool2d") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  for (int trial = 0; trial < 4; ++trial) {
    const Shape shape{sg::test::pick(rng, 1, 3), sg::test::pick(rng, 1, 4), sg::test::pick(rng, 1, 6),
                      sg::test::pick(rng, 1, 6)};
    CAPTURE(shape_string(shape));
    Graph g;
    const auto x = g.param("x", shape, DType::f32);
    sg::test::check_gradients_through_mse(g, global_pool(g, x), rng, 0);
  }
  // A residual CNN's head: conv -> relu -> avg_pool2d -> global mean, every
  // parameter (the input too) checked through both poolings.
  Graph g;
  const auto x = g.param("x", {2, 2, 7, 7}, DType::f32);
  const auto w = g.param("w", {3, 2, 3, 3}, DType::f32);
  const auto b = g.param("b", {3}, DType::f32);
  const auto c = g.append_node(OpKind::conv2d, {x, w, b}, Conv2dAttrs{1, 1, 0, 0}).front();
  sg::test::check_gradients_through_mse(g, global_pool(g, avg_pool(g, g.relu(c), 2, 2)), rng, 0);
}

TEST_CASE("mean pooling's shape errors name the op and the shapes") {
  Graph g;
  const auto x = g.input("x", {2, 3, 4, 4}, DType::f32);
  CHECK_THROWS_WITH_AS(avg_pool(g, x, 5, 1), doctest::Contains("avg_pool2d: kernel 5x5 is larger than the input 'x'"),
                       GraphError);
  CHECK_THROWS_WITH_AS(avg_pool(g, x, 2, 0), doctest::Contains("avg_pool2d: kernel 2 and stride 0 must be >= 1"),
                       GraphError);
  CHECK_THROWS_WITH_AS(global_pool(g, g.input("v", {2, 3}, DType::f32)), doctest::Contains("global_avg_pool2d"),
                       GraphError);
  const auto dy = g.input("dy", {2, 3, 2, 2}, DType::f32);
  CHECK_THROWS_WITH_AS(g.append_node(OpKind::avg_pool2d_backward, {dy}, Pool2dAttrs{2, 2}),
                       doctest::Contains("grad_h 0 and grad_w 0"), GraphError);
  CHECK_THROWS_WITH_AS(g.append_node(OpKind::avg_pool2d_backward, {dy}, Pool2dAttrs{2, 2, 6, 4}),
                       doctest::Contains("is not the pooled shape of [2,3,6,4]"), GraphError);
  CHECK_THROWS_WITH_AS(g.append_node(OpKind::global_avg_pool2d_backward, {dy}, ReshapeAttrs{{2, 3, 4, 4}}),
                       doctest::Contains("global_avg_pool2d_backward: gradient 'dy' [2,3,2,2] f32 is not the pooled"),
                       GraphError);
}

TEST_CASE("channels-last avg_pool2d: [N,H,W,C] in and out, the NCHW op's values, finite-difference gradients") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  for (int trial = 0; trial < 6; ++trial) {
    const std::int64_t kernel = sg::test::pick(rng, 1, 3), stride = sg::test::pick(rng, 1, 3);
    const std::int64_t n = sg::test::pick(rng, 1, 3), c = sg::test::pick(rng, 1, 4);
    const std::int64_t h = kernel + sg::test::pick(rng, 0, 4), w = kernel + sg::test::pick(rng, 0, 4);
    CAPTURE(kernel);
    CAPTURE(stride);
    Graph g;
    const auto x = g.param("x", {n, h, w, c}, DType::f32);
    const auto y = g.append_node(OpKind::avg_pool2d, {x}, Pool2dAttrs{kernel, stride, 0, 0, true}).front();
    const std::int64_t oh = (h - kernel) / stride + 1, ow = (w - kernel) / stride + 1;
    REQUIRE(g.value(y).shape == Shape{n, oh, ow, c});
    // The same values as the NCHW op on the transposed input.
    Graph nchw;
    const auto xf = nchw.input("x", {n, c, h, w}, DType::f32);
    const auto yf = avg_pool(nchw, xf, kernel, stride);
    CpuExecutor<double> last(g), first(nchw);
    std::uniform_real_distribution<double> u(-1, 1);
    for (double& v : last.tensor(x).real) v = u(rng);
    first.tensor(xf).real.resize(last.tensor(x).real.size());
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t p = 0; p < h * w; ++p)
        for (std::int64_t ch = 0; ch < c; ++ch)
          first.tensor(xf).real[(i * c + ch) * h * w + p] = last.tensor(x).real[(i * h * w + p) * c + ch];
    last.run();
    first.run();
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t p = 0; p < oh * ow; ++p)
        for (std::int64_t ch = 0; ch < c; ++ch)
          CHECK(last.tensor(y).real[(i * oh * ow + p) * c + ch] == first.tensor(yf).real[(i * c + ch) * oh * ow + p]);
    sg::test::check_gradients_through_mse(g, y, rng, 0);
  }
}
