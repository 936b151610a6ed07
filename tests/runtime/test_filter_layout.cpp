// Convolution filters read channels-last ([O,KH,KW,C], Conv2dAttrs::
// filter_channels_last; graph/filter_layout_pass.hpp) on the CPU reference:
// each conv op with a [O,KH,KW,C] filter against the same op with the
// parameter's [O,C,KH,KW] on random shapes in both activation layouts (f64,
// poisoned outputs), its gradient against finite differences, and the pass on
// channels-last training graphs: which convolutions read a copy, where the
// copies sit, and training steps equal to the graph's without them.
#include <doctest/doctest.h>

#include <cmath>

#include "graph/autodiff.hpp"
#include "graph/channels_last_pass.hpp"
#include "graph/filter_layout_pass.hpp"
#include "graph/training_graph.hpp"
#include "models/sequential.hpp"
#include "tests/runtime/finite_differences.hpp"
#include "tests/runtime/layer_specs.hpp"
#include "tests/runtime/sequential_cpu_steps.hpp"
#include "tests/runtime/test_support.hpp"
#include "tests/support/filter_layouts.hpp"

using namespace sg;
using sg::test::net_layer;

namespace {

// Input channels 1 and 8-12 (both sides of the pass's threshold), a stride-2 conv, padding, a pooling.
SequentialSpec wide_cnn(std::int64_t batch) {
  SequentialSpec s;
  s.input_shape = {1, 10, 10};
  s.layers = {net_layer(LayerKind::conv2d, 8, 3, 1),  net_layer(LayerKind::activation),
              net_layer(LayerKind::conv2d, 12, 3, 1), net_layer(LayerKind::activation),
              net_layer(LayerKind::max_pool2d, 0, 2), net_layer(LayerKind::conv2d, 9, 3, 1, 2),
              net_layer(LayerKind::flatten),          net_layer(LayerKind::linear, 4)};
  s.batch = batch;
  s.dataset_rows = 40;
  s.weight_dtype = DType::f32;
  s.compute_dtype = DType::f32;
  return s;
}

// Where the filters' copies go: none; into the forward graph, before autodiff
// (as the model builder does: the weight gradients then come out
// [O,KH,KW,C]); into the training graph (the weight gradients stay).
enum class Copies { none, before_autodiff, after_autodiff };

// The channels-last training graph of `spec` (unfused).
Graph training_graph(const SequentialSpec& spec, const OptimizerSpec& optimizer, Copies copies) {
  Graph forward = rewrite_channels_last(build_sequential_forward(spec))->graph;
  if (copies == Copies::before_autodiff) use_channels_last_filters(forward);
  Graph g = test::sequential_training_stages(std::move(forward), optimizer).optimized;
  if (copies == Copies::after_autodiff) use_channels_last_filters(g);
  return g;
}

}  // namespace

TEST_CASE("conv2d and its backward ops with [O,KH,KW,C] filters compute what they do with [O,C,KH,KW]") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  const auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return lo + std::int64_t(rng() % std::uint64_t(hi - lo + 1));
  };
  for (int trial = 0; trial < 24; ++trial) {
    const std::int64_t n = pick(1, 3), c = pick(1, 9), h = pick(3, 8), w = pick(3, 8), o = pick(1, 7);
    const std::int64_t kh = pick(1, 3), kw = pick(1, 3), stride = pick(1, 2), padding = pick(0, 1);
    const bool last = trial % 2 == 1, bias = trial % 3 == 0;
    INFO("x " << n << "x" << c << "x" << h << "x" << w << " w " << o << "x" << c << "x" << kh << "x" << kw << " stride "
              << stride << " padding " << padding << (last ? " channels-last" : ""));
    const std::int64_t oh = (h + 2 * padding - kh) / stride + 1, ow = (w + 2 * padding - kw) / stride + 1;
    const Shape xs = last ? Shape{n, h, w, c} : Shape{n, c, h, w};
    const Shape ys = last ? Shape{n, oh, ow, o} : Shape{n, o, oh, ow};
    std::vector<double> xv(static_cast<std::size_t>(n * c * h * w)), wv(static_cast<std::size_t>(o * c * kh * kw)),
        bv(static_cast<std::size_t>(o)), dyv(static_cast<std::size_t>(n * o * oh * ow));
    for (auto* v : {&xv, &wv, &bv, &dyv}) sg::test::fill_uniform(*v, rng);
    // One graph per filter layout: the forward, the data gradient and the filter gradient.
    std::vector<std::vector<double>> outputs[2];
    for (const bool krsc : {false, true}) {
      Graph g;
      const auto x = g.input("x", xs, DType::f32);
      const auto k = g.param("w", krsc ? Shape{o, kh, kw, c} : Shape{o, c, kh, kw}, DType::f32);
      const auto b = g.param("b", {o}, DType::f32);
      const auto dy = g.input("dy", ys, DType::f32);
      Conv2dAttrs a{stride, padding, 0, 0, last, krsc};
      std::vector<ValueId> in{x, k};
      if (bias) in.push_back(b);
      const auto y = g.append_node(OpKind::conv2d, in, a).front();
      a.grad_h = h;
      a.grad_w = w;
      const auto dx = g.append_node(OpKind::conv2d_backward_data, {dy, k}, a).front();
      a.grad_h = kh;
      a.grad_w = kw;
      const auto dw = g.append_node(OpKind::conv2d_backward_filter, {dy, x}, a).front();
      CHECK(g.value(dw).shape == g.value(k).shape);
      CpuExecutor<double> e(g);
      e.tensor(x).real = xv;
      e.tensor(k).real = krsc ? test::filter_to_krsc(wv, o, c, kh * kw) : wv;
      e.tensor(b).real = bv;
      e.tensor(dy).real = dyv;
      for (ValueId out : {y, dx, dw}) std::fill(e.tensor(out).real.begin(), e.tensor(out).real.end(), NAN);
      e.run();
      outputs[krsc] = {e.tensor(y).real, e.tensor(dx).real,
                       krsc ? e.tensor(dw).real : test::filter_to_krsc(e.tensor(dw).real, o, c, kh * kw)};
    }
    for (int i = 0; i < 3; ++i) {
      INFO("output " << i << " (forward, data gradient, filter gradient as [O,KH,KW,C])");
      for (double v : outputs[1][static_cast<std::size_t>(i)]) REQUIRE(std::isfinite(v));
      CHECK(outputs[1][static_cast<std::size_t>(i)] == outputs[0][static_cast<std::size_t>(i)]);
    }
  }
}

TEST_CASE("conv2d with an [O,KH,KW,C] filter: gradients against finite differences (channels-last activations)") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  Graph g;
  const auto x = g.input("x", {2, 5, 6, 3}, DType::f32);
  const auto k = g.param("w", {4, 3, 2, 3}, DType::f32);  // 4 filters of 3x2 taps over 3 channels
  const auto b = g.param("b", {4}, DType::f32);
  const auto y = g.append_node(OpKind::conv2d, {x, k, b}, Conv2dAttrs{2, 1, 0, 0, true, true}).front();
  sg::test::check_gradients_through_mse(std::move(g), y, rng, 0);
}

TEST_CASE("use_channels_last_filters: one [O,KH,KW,C] copy a filter of 8+ channels, before its first convolution") {
  OptimizerSpec optimizer;
  optimizer.lr = 0.05;
  optimizer.momentum = 0.9;
  Graph g = training_graph(wide_cnn(4), optimizer, Copies::none);
  const int before = static_cast<int>(g.nodes().size());
  CHECK(use_channels_last_filters(g) == 2);  // the 8- and 12-channel inputs' filters, not the image's
  CHECK(static_cast<int>(g.nodes().size()) == before + 2);
  int forwards = 0, data_gradients = 0, filter_gradients = 0;
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::conv2d && n.op != OpKind::conv2d_backward_data && n.op != OpKind::conv2d_backward_filter)
      continue;
    const auto& a = n.attr<Conv2dAttrs>();
    if (n.op == OpKind::conv2d_backward_filter) {  // the gradient keeps the parameter's layout: the update reads it
      CHECK_FALSE(a.filter_channels_last);
      ++filter_gradients;
      continue;
    }
    const Value& filter = g.value(n.inputs[1]);
    const bool wide = n.op == OpKind::conv2d_backward_data || g.value(n.inputs[0]).shape[3] >= 8;
    CHECK(a.filter_channels_last == wide);
    if (!wide) {
      CHECK(filter.role == Role::param);
      continue;
    }
    // The copy: the parameter through to_channels_last, made before this node.
    const Node& copy = g.node(filter.producer);
    CHECK(copy.op == OpKind::to_channels_last);
    CHECK(g.value(copy.inputs[0]).role == Role::param);
    CHECK(copy.id < n.id);
    forwards += n.op == OpKind::conv2d;
    data_gradients += n.op == OpKind::conv2d_backward_data;
  }
  CHECK(forwards == 2);
  CHECK(data_gradients == 2);
  CHECK(filter_gradients == 3);
  CHECK(use_channels_last_filters(g) == 0);  // a second run finds nothing left to copy
  Graph narrow = training_graph(wide_cnn(4), optimizer, Copies::none);
  CHECK(use_channels_last_filters(narrow, 13) == 0);  // none has 13 input channels
  Graph nchw = test::sequential_training_stages(build_sequential_forward(wide_cnn(4)), optimizer).optimized;
  CHECK(use_channels_last_filters(nchw) == 0);  // NCHW convolutions keep theirs
}

TEST_CASE("training steps with the filters' channels-last copies equal those without, bit for bit (f64)") {
  for (const OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::adamw}) {
    INFO(optimizer_name(kind));
    OptimizerSpec optimizer;
    optimizer.kind = kind;
    optimizer.lr = kind == OptimizerKind::sgd ? 0.05 : 0.01;
    optimizer.momentum = kind == OptimizerKind::sgd ? 0.9 : 0.0;
    const SequentialSpec spec = wide_cnn(5);
    const Graph none = training_graph(spec, optimizer, Copies::none);
    const auto start = test::sequential_cpu_steps(none, spec, optimizer.lr, 0, 7);
    const auto plain = test::sequential_cpu_steps(none, spec, optimizer.lr, 3, 7);
    for (const Copies copies : {Copies::before_autodiff, Copies::after_autodiff}) {
      INFO((copies == Copies::before_autodiff ? "copies before autodiff" : "copies after autodiff"));
      const auto copied = test::sequential_cpu_steps(training_graph(spec, optimizer, copies), spec, optimizer.lr, 3, 7);
      REQUIRE(plain.size() == copied.size());
      CHECK(plain == copied);
    }
    double moved = 0;
    for (std::size_t i = 0; i < plain.size(); ++i) moved += std::abs(plain[i] - start[i]);
    CHECK(moved > 1e-3);  // the steps did move the parameters
  }
}

TEST_CASE("filter copies in the forward graph: autodiff gives [O,KH,KW,C] weight gradients and their way back") {
  OptimizerSpec optimizer;
  optimizer.lr = 0.05;
  const Graph g = training_graph(wide_cnn(4), optimizer, Copies::before_autodiff);
  int wide = 0;
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::conv2d_backward_filter) continue;
    const auto& a = n.attr<Conv2dAttrs>();
    const bool copied = g.value(n.inputs[1]).shape[3] >= 8;  // X channels-last: [N,H,W,C]
    CHECK(a.filter_channels_last == copied);
    if (!copied) continue;
    ++wide;
    // dW [O,KH,KW,C] -> to_channels_first (the copy's gradient) -> the parameter's gradient.
    const auto readers = g.consumers(n.outputs[0]);
    REQUIRE(readers.size() == 1);
    const Node& back = g.node(readers[0]);
    CHECK(back.op == OpKind::to_channels_first);
    CHECK(g.value(back.outputs[0]).shape == Shape{g.value(n.outputs[0]).shape[0], g.value(n.outputs[0]).shape[3],
                                                 g.value(n.outputs[0]).shape[1], g.value(n.outputs[0]).shape[2]});
  }
  CHECK(wide == 2);
}
