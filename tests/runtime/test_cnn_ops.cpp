// Issue 22's CNN ops on the CPU backend: conv2d (+ its data / filter / bias
// gradients), max_pool2d, flatten / reshape and dropout2d. Finite-difference
// gradient checks in f64, the conv reference against an independent naive
// implementation, max-pool's tie rule, dropout2d's channel mask, shape-rule
// errors, and the element-wise ops the CNN uses on rank-4 values.
//
// The loss: the report's network ends in log_softmax + NLL loss, which is
// exactly cross-entropy on the logits, i.e. our softmax_xent (mean over the
// batch of -log softmax(logits)[label]); no new op. The last test checks
// softmax_xent against log_softmax + NLL written out.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>

#include "graph/autodiff.hpp"
#include "ops/philox.hpp"
#include "runtime/cpu/cpu_executor.hpp"
#include "tests/runtime/finite_differences.hpp"
#include "tests/runtime/test_support.hpp"

using namespace sg;

namespace {

constexpr std::int32_t kStep = 5;  // the step counter value of every FD run (dropout2d's mask is fixed)

void check_against_finite_differences(Graph g, ValueId out, std::mt19937_64& rng) {
  sg::test::check_gradients_through_mse(std::move(g), out, rng, kStep);
}

// An independent conv2d: copy X into an explicitly zero-padded buffer, then
// take every output as the dot product of a kernel with a strided window.
std::vector<double> naive_conv2d(const std::vector<double>& x, const std::vector<double>& w,
                                 const std::vector<double>* bias, const Shape& xs, const Shape& ws, std::int64_t s,
                                 std::int64_t p) {
  const std::int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3], O = ws[0], KH = ws[2], KW = ws[3];
  const std::int64_t HP = H + 2 * p, WP = W + 2 * p;
  std::vector<double> padded(static_cast<std::size_t>(N * C * HP * WP), 0.0);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t c = 0; c < C; ++c)
      for (std::int64_t y = 0; y < H; ++y)
        for (std::int64_t xx = 0; xx < W; ++xx)
          padded[static_cast<std::size_t>(((n * C + c) * HP + y + p) * WP + xx + p)] =
              x[static_cast<std::size_t>(((n * C + c) * H + y) * W + xx)];
  const std::int64_t OH = (HP - KH) / s + 1, OW = (WP - KW) / s + 1;
  std::vector<double> y(static_cast<std::size_t>(N * O * OH * OW));
  std::size_t at = 0;
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t o = 0; o < O; ++o)
      for (std::int64_t oy = 0; oy < OH; ++oy)
        for (std::int64_t ox = 0; ox < OW; ++ox) {
          double acc = bias ? (*bias)[static_cast<std::size_t>(o)] : 0.0;
          std::size_t k = static_cast<std::size_t>(o * C * KH * KW);
          for (std::int64_t c = 0; c < C; ++c)
            for (std::int64_t i = 0; i < KH; ++i)
              for (std::int64_t j = 0; j < KW; ++j)
                acc += w[k++] * padded[static_cast<std::size_t>(((n * C + c) * HP + oy * s + i) * WP + ox * s + j)];
          y[at++] = acc;
        }
  return y;
}

struct ConvCase {
  int stride, padding;
  bool bias;
};

}  // namespace

TEST_CASE("conv2d gradients (dX, dW, bias) against finite differences: odd sizes, padding 1 and 2, stride 2") {
  const ConvCase cases[] = {{1, 1, true}, {1, 1, false}, {1, 2, true}, {1, 2, false}, {2, 1, true},
                            {2, 0, false}, {2, 2, true}, {1, 0, true}};
  for (const auto& cc : cases) {
    auto rng = sg::test::fresh_rng();
    INFO("random seed " << sg::test::last_seed() << " stride " << cc.stride << " padding " << cc.padding << " bias "
                        << cc.bias);
    std::uniform_int_distribution<std::int64_t> small(1, 3), kernel(1, 4), extent(5, 9);
    const std::int64_t n = small(rng), c = small(rng), o = small(rng), kh = kernel(rng), kw = kernel(rng);
    const std::int64_t h = extent(rng) | 1, w = extent(rng);  // h odd; w odd or even
    INFO("x [" << n << "," << c << "," << h << "," << w << "] w [" << o << "," << c << "," << kh << "," << kw << "]");
    Graph g;
    const auto x = g.param("x", {n, c, h, w}, DType::f32);
    const auto k = g.param("w", {o, c, kh, kw}, DType::f32);
    std::optional<ValueId> b;
    if (cc.bias) b = g.param("b", {o}, DType::f32);
    const auto y = g.conv2d(x, k, b, cc.stride, cc.padding);
    CHECK(g.value(y).shape ==
          Shape{n, o, (h + 2 * cc.padding - kh) / cc.stride + 1, (w + 2 * cc.padding - kw) / cc.stride + 1});
    check_against_finite_differences(g, y, rng);
  }
}

TEST_CASE("the conv2d CPU reference matches a naive padded-buffer implementation on random shapes (f32 and f64)") {
  for (int trial = 0; trial < 12; ++trial) {
    auto rng = sg::test::fresh_rng();
    std::uniform_int_distribution<std::int64_t> small(1, 4), kernel(1, 5), extent(3, 13), stride(1, 3), pad(0, 2);
    const std::int64_t n = small(rng), c = small(rng), o = small(rng), kh = kernel(rng), kw = kernel(rng);
    const std::int64_t h = std::max(extent(rng), kh), w = std::max(extent(rng), kw), s = stride(rng), p = pad(rng);
    const bool with_bias = trial % 2 == 0;
    INFO("random seed " << sg::test::last_seed() << " x [" << n << "," << c << "," << h << "," << w << "] w [" << o
                        << "," << c << "," << kh << "," << kw << "] stride " << s << " padding " << p);
    Graph g;
    const auto x = g.input("x", {n, c, h, w}, DType::f32);
    const auto k = g.param("w", {o, c, kh, kw}, DType::f32);
    std::optional<ValueId> b;
    if (with_bias) b = g.param("b", {o}, DType::f32);
    const auto y = g.conv2d(x, k, b, static_cast<int>(s), static_cast<int>(p));

    std::vector<double> xv(static_cast<std::size_t>(n * c * h * w)), wv(static_cast<std::size_t>(o * c * kh * kw)),
        bv(static_cast<std::size_t>(o));
    sg::test::fill_uniform(xv, rng);
    sg::test::fill_uniform(wv, rng);
    sg::test::fill_uniform(bv, rng);
    const auto want = naive_conv2d(xv, wv, with_bias ? &bv : nullptr, {n, c, h, w}, {o, c, kh, kw}, s, p);

    CpuExecutor<double> exec64(g);
    exec64.tensor(x).real = xv;
    exec64.tensor(k).real = wv;
    if (b) exec64.tensor(*b).real = bv;
    std::fill(exec64.tensor(y).real.begin(), exec64.tensor(y).real.end(), NAN);  // poison: unwritten shows
    exec64.run();
    CHECK(sg::test::relative_error(exec64.tensor(y).real, want) < 1e-13);

    CpuExecutor<float> exec32(g);
    exec32.tensor(x).real.assign(xv.begin(), xv.end());
    exec32.tensor(k).real.assign(wv.begin(), wv.end());
    if (b) exec32.tensor(*b).real.assign(bv.begin(), bv.end());
    std::fill(exec32.tensor(y).real.begin(), exec32.tensor(y).real.end(), NAN);
    exec32.run();
    CHECK(sg::test::relative_error(exec32.tensor(y).real, want) < 1e-5);
  }
}

TEST_CASE("max_pool2d gradient against finite differences (floor sizes, overlapping windows)") {
  const std::pair<int, int> cases[] = {{2, 2}, {3, 2}, {2, 1}, {3, 3}};
  for (const auto& [kernel, stride] : cases) {
    auto rng = sg::test::fresh_rng();
    INFO("random seed " << sg::test::last_seed() << " kernel " << kernel << " stride " << stride);
    std::uniform_int_distribution<std::int64_t> small(1, 3), extent(5, 9);
    const std::int64_t n = small(rng), c = small(rng), h = extent(rng) | 1, w = extent(rng);
    Graph g;
    const auto x = g.param("x", {n, c, h, w}, DType::f32);
    const auto y = g.max_pool2d(x, kernel, stride);
    CHECK(g.value(y).shape == Shape{n, c, (h - kernel) / stride + 1, (w - kernel) / stride + 1});
    // Uniform random values: no ties, and the gap between a window's two
    // largest values is far above the FD step almost surely.
    check_against_finite_differences(g, y, rng);
  }
}

TEST_CASE("max_pool2d routes each gradient to the FIRST maximum of its window (PyTorch's tie rule)") {
  Graph g;
  const auto x = g.input("x", {1, 1, 2, 6}, DType::f32);
  const auto dy = g.input("dy", {1, 1, 1, 3}, DType::f32);
  const auto y = g.max_pool2d(x, 2, 2);
  const auto dx = g.append_node(OpKind::max_pool2d_backward, {dy, x}, Pool2dAttrs{2, 2}).front();
  CpuExecutor<double> exec(g);
  // Windows (row-major): {1, 3 / 3, 0}: max 3 at (0,1) before (1,0);
  // {5, 5 / 5, 5}: all tied, (0,2) first; {-1, -2 / -1, -4}: (0,4) before (1,4).
  exec.tensor(x).real = {1, 3, 5, 5, -1, -2,  //
                         3, 0, 5, 5, -1, -4};
  exec.tensor(dy).real = {10, 20, 30};
  exec.run();
  CHECK(exec.tensor(y).real == std::vector<double>{3, 5, -1});
  CHECK(exec.tensor(dx).real == std::vector<double>{0, 10, 20, 0, 30, 0,  //
                                                    0, 0, 0, 0, 0, 0});
  // Overlapping windows (stride 1) accumulate at a shared maximum.
  Graph g3;
  const auto x3 = g3.input("x", {1, 1, 2, 3}, DType::f32);
  const auto dy3 = g3.input("dy", {1, 1, 1, 2}, DType::f32);
  const auto dx3 = g3.append_node(OpKind::max_pool2d_backward, {dy3, x3}, Pool2dAttrs{2, 1}).front();
  CpuExecutor<double> e3(g3);
  e3.tensor(x3).real = {0, 7, 1,  //
                        2, 7, 3};
  e3.tensor(dy3).real = {1.5, 2.5};
  e3.run();
  CHECK(e3.tensor(dx3).real == std::vector<double>{0, 4, 0, 0, 0, 0});
}

TEST_CASE("flatten and reshape: row-major order kept, gradients reshape back") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  {
    Graph g;
    const auto x = g.param("x", {2, 3, 5, 3}, DType::f32);
    const auto f = g.flatten(x);
    CHECK(g.value(f).shape == Shape{2, 45});
    CpuExecutor<double> exec(g);
    sg::test::fill_uniform(exec.tensor(x).real, rng);
    exec.run();
    CHECK(exec.tensor(f).real == exec.tensor(x).real);
  }
  {
    // flatten(x) in the middle of the graph (the helper flattens once more),
    // then reshape, whose gradient is a reshape back.
    Graph g;
    const auto x = g.param("x", {3, 2, 3, 5}, DType::f32);
    const auto f = g.flatten(x);
    const auto r = g.reshape(g.relu(g.add(f, f)), {3, 5, 6, 1});
    CHECK(g.value(r).shape == Shape{3, 5, 6, 1});
    check_against_finite_differences(g, r, rng);
  }
  Graph g;
  const auto x = g.input("x", {2, 3, 4}, DType::f32);
  CHECK_THROWS_WITH_AS(g.reshape(x, {5, 5}), "reshape: cannot reshape 'x' [2,3,4] f32 to [5,5]: element counts differ",
                       GraphError);
  CHECK_THROWS_WITH_AS(g.flatten(g.input("v", {7}, DType::f32)), "flatten: 'v' [7] f32 must have rank >= 2 ([N, ...])",
                       GraphError);
}

TEST_CASE("dropout2d gradient against finite differences at a fixed step (fixed mask)") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  Graph g;
  const auto x = g.param("x", {3, 4, 3, 5}, DType::f32);
  const auto step = g.state("step", {1}, DType::i32);
  const auto k = g.param("w", {2, 4, 2, 2}, DType::f32);
  // dropout2d between a conv and the loss, as in the report's network.
  const auto y = g.conv2d(g.dropout2d(x, 0.5, step, 77, 1), k, std::nullopt, 1, 0);
  check_against_finite_differences(g, y, rng);
}

namespace {

struct Dropout2dRun {
  std::vector<float> x, y, dy, dx;
  std::vector<float> flat_mask;  // dropout (element-wise) of ones [N*C] with the same attributes
};

Dropout2dRun run_dropout2d(std::int64_t n, std::int64_t c, std::int64_t plane_h, std::int64_t plane_w,
                           const DropoutAttrs& attrs, std::int32_t step) {
  Graph g;
  const auto x = g.input("x", {n, c, plane_h, plane_w}, DType::f32);
  const auto dy = g.input("dy", {n, c, plane_h, plane_w}, DType::f32);
  const auto ones = g.input("ones", {n * c}, DType::f32);
  const auto s = g.state("step", {1}, DType::i32);
  const auto y = g.dropout2d(x, attrs.p, s, attrs.seed, attrs.stream);
  const auto dx = g.append_node(OpKind::dropout2d_backward, {dy, s}, attrs).front();
  const auto flat = g.append_node(OpKind::dropout, {ones, s}, attrs).front();
  CpuExecutor<float> exec(g);
  auto rng = sg::test::fresh_rng();
  sg::test::fill_uniform(exec.tensor(x).real, rng, 0.5, 1.5);  // never 0, so a 0 output means dropped
  sg::test::fill_uniform(exec.tensor(dy).real, rng, 0.5, 1.5);
  std::fill(exec.tensor(ones).real.begin(), exec.tensor(ones).real.end(), 1.f);
  exec.tensor(s).i32[0] = step;
  exec.run();
  return {exec.tensor(x).real, exec.tensor(y).real, exec.tensor(dy).real, exec.tensor(dx).real,
          exec.tensor(flat).real};
}

// Per channel: kept (every element of y and dx scaled by 1/(1-p)) or
// dropped (all 0). Counts the elements that are neither in `partial`.
std::vector<bool> channel_mask(const Dropout2dRun& r, std::int64_t channels, std::int64_t plane, double p,
                               std::int64_t& partial) {
  std::vector<bool> kept(static_cast<std::size_t>(channels));
  const double scale = 1.0 / (1.0 - p);
  for (std::int64_t ch = 0; ch < channels; ++ch) {
    const auto base = static_cast<std::size_t>(ch * plane);
    const bool keep = r.y[base] != 0.f;
    kept[static_cast<std::size_t>(ch)] = keep;
    for (std::int64_t k = 0; k < plane; ++k) {
      const auto i = base + static_cast<std::size_t>(k);
      const bool ok = keep ? std::abs(r.y[i] - r.x[i] * scale) <= 1e-6 * r.x[i] * scale &&
                                 std::abs(r.dx[i] - r.dy[i] * scale) <= 1e-6 * r.dy[i] * scale
                           : r.y[i] == 0.f && r.dx[i] == 0.f;
      partial += !ok;
    }
  }
  return kept;
}

std::vector<bool> checked_mask(std::int64_t n, std::int64_t c, const DropoutAttrs& attrs, std::int32_t step) {
  const auto run = run_dropout2d(n, c, 3, 3, attrs, step);
  std::int64_t partial = 0;
  auto kept = channel_mask(run, n * c, 9, attrs.p, partial);
  CHECK(partial == 0);
  return kept;
}

}  // namespace

TEST_CASE("dropout2d drops whole channels, keeps close to 1 - p of them, with dropout's Philox bits") {
  const std::int64_t n = 250, c = 400, h = 2, w = 3;  // 100000 channels
  for (double p : {0.1, 0.5, 0.8}) {
    INFO("p " << p);
    const DropoutAttrs attrs{p, 0x5eed5eedull, 2};
    const auto r = run_dropout2d(n, c, h, w, attrs, 11);
    std::int64_t partial = 0;
    const auto kept = channel_mask(r, n * c, h * w, p, partial);
    CHECK(partial == 0);  // whole channels only, scaled by 1 / (1 - p), in the forward and the backward
    std::int64_t kept_count = 0, unlike_dropout = 0;
    for (std::size_t ch = 0; ch < kept.size(); ++ch) {
      kept_count += kept[ch];
      // Channel (b, c) uses dropout's keep bit of element b * C + c.
      unlike_dropout += kept[ch] != (r.flat_mask[ch] != 0.f);
    }
    CHECK(unlike_dropout == 0);
    const double fraction = static_cast<double>(kept_count) / static_cast<double>(n * c);
    // Binomial standard deviation sqrt(p (1-p) / channels): 5 sigma.
    CHECK(std::abs(fraction - (1.0 - p)) < 5 * std::sqrt(p * (1 - p) / static_cast<double>(n * c)));
  }
}

TEST_CASE("dropout2d: the same bits on a rerun, other bits at another step, seed or stream, p = 0 keeps all") {
  const std::int64_t n = 16, c = 20, h = 3, w = 3;
  const DropoutAttrs attrs{0.5, 42, 1};
  const auto a = checked_mask(n, c, attrs, 3);
  const auto again = checked_mask(n, c, attrs, 3);
  const auto other_step = checked_mask(n, c, attrs, 4);
  const auto other_seed = checked_mask(n, c, {0.5, 43, 1}, 3);
  const auto other_stream = checked_mask(n, c, {0.5, 42, 2}, 3);
  CHECK(a == again);
  CHECK(a != other_step);
  CHECK(a != other_seed);
  CHECK(a != other_stream);
  const auto none = run_dropout2d(n, c, h, w, {0.0, 42, 1}, 3);
  CHECK(none.y == none.x);
  CHECK(none.dx == none.dy);
}

TEST_CASE("relu, relu_backward and add on rank-4 values (CPU)") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  Graph g;
  const Shape s{2, 3, 4, 5};
  const auto a = g.input("a", s, DType::f32);
  const auto b = g.input("b", s, DType::f32);
  const auto sum = g.add(a, b);
  const auto r = g.relu(sum);
  const auto dr = g.relu_backward(b, r);
  CHECK(g.value(sum).shape == s);
  CHECK(g.value(r).shape == s);
  CHECK(g.value(dr).shape == s);
  CpuExecutor<double> exec(g);
  sg::test::fill_uniform(exec.tensor(a).real, rng);
  sg::test::fill_uniform(exec.tensor(b).real, rng);
  exec.run();
  const auto& av = exec.tensor(a).real;
  const auto& bv = exec.tensor(b).real;
  std::size_t positive = 0;
  for (std::size_t i = 0; i < av.size(); ++i) {
    const double z = av[i] + bv[i];
    CHECK(exec.tensor(sum).real[i] == z);
    CHECK(exec.tensor(r).real[i] == (z > 0 ? z : 0.0));
    CHECK(exec.tensor(dr).real[i] == (z > 0 ? bv[i] : 0.0));
    positive += z > 0;
  }
  CHECK(positive > 0);
  CHECK(positive < av.size());
}

TEST_CASE("the report's CNN in miniature: every parameter gradient against finite differences") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  // conv -> max_pool -> relu -> conv -> dropout2d -> max_pool -> relu ->
  // flatten -> linear -> relu -> linear (the loss helper adds flatten + MSE).
  // 12 hidden units and 3 samples: all units dead on every sample (every
  // gradient but f2b zero) is then vanishingly unlikely.
  Graph g;
  const auto x = g.input("x", {3, 1, 16, 16}, DType::f32);
  const auto step = g.state("step", {1}, DType::i32);
  auto h = g.relu(g.max_pool2d(
      g.conv2d(x, g.param("c1w", {3, 1, 5, 5}, DType::f32), g.param("c1b", {3}, DType::f32), 1, 0), 2, 2));
  h = g.conv2d(h, g.param("c2w", {4, 3, 3, 3}, DType::f32), g.param("c2b", {4}, DType::f32), 1, 1);
  h = g.relu(g.max_pool2d(g.dropout2d(h, 0.5, step, 9, 1), 2, 2));
  auto f = g.flatten(h);
  CHECK(g.value(f).shape == Shape{3, 36});
  f = g.relu(g.linear(f, g.param("f1w", {12, 36}, DType::f32), g.param("f1b", {12}, DType::f32)));
  f = g.linear(f, g.param("f2w", {3, 12}, DType::f32), g.param("f2b", {3}, DType::f32));
  check_against_finite_differences(g, f, rng);
}

TEST_CASE("conv2d and max_pool2d shape-rule errors name the values") {
  Graph g;
  const auto x = g.input("x", {2, 3, 8, 8}, DType::f32);
  CHECK_THROWS_WITH_AS(g.conv2d(x, g.param("w_mismatch", {4, 2, 3, 3}, DType::f32), std::nullopt, 1, 0),
                       "conv2d: channel mismatch: input 'x' [2,3,8,8] f32 has 3 channels, weight 'w_mismatch' "
                       "[4,2,3,3] f32 expects 2",
                       GraphError);
  const auto small = g.input("small", {1, 1, 4, 4}, DType::f32);
  CHECK_THROWS_WITH_AS(g.conv2d(small, g.param("w_big", {1, 1, 7, 7}, DType::f32), std::nullopt, 1, 1),
                       "conv2d: kernel 7x7 of 'w_big' [1,1,7,7] f32 is larger than the padded input 6x6 (padding 1) "
                       "of 'small' [1,1,4,4] f32",
                       GraphError);
  const auto w = g.param("w", {4, 3, 3, 3}, DType::f32);
  CHECK_THROWS_WITH_AS(g.conv2d(x, w, g.param("b_wrong", {3}, DType::f32), 1, 0),
                       "conv2d: bias 'b_wrong' [3] f32 must be [4], one per output channel of weight 'w' [4,3,3,3] f32",
                       GraphError);
  CHECK_THROWS_WITH_AS(g.conv2d(x, w, std::nullopt, 0, 0), "conv2d: stride 0 must be >= 1", GraphError);
  CHECK_THROWS_WITH_AS(g.conv2d(g.input("flat", {2, 192}, DType::f32), w, std::nullopt, 1, 0),
                       "conv2d: 'flat' [2,192] f32 must have rank 4", GraphError);
  CHECK_THROWS_WITH_AS(g.max_pool2d(small, 5, 1), "max_pool2d: kernel 5x5 is larger than the input 'small' [1,1,4,4] f32",
                       GraphError);
  const auto step = g.state("step", {1}, DType::i32);
  CHECK_THROWS_WITH_AS(g.dropout2d(x, 1.0, step, 0, 0), "dropout2d: dropout probability p = 1 must be in [0, 1)",
                       GraphError);
  CHECK_THROWS_WITH_AS(g.dropout2d(g.input("v", {2, 6}, DType::f32), 0.5, step, 0, 0),
                       "dropout2d: 'v' [2,6] f32 must have rank 4", GraphError);
  // Valid: a kernel that fits only thanks to the padding.
  CHECK(g.value(g.conv2d(small, g.param("w5", {2, 1, 5, 5}, DType::f32), std::nullopt, 1, 1)).shape ==
        Shape{1, 2, 2, 2});
}

TEST_CASE("softmax_xent is log_softmax + NLL loss (the report's loss) on the logits") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  Graph g;
  const auto logits = g.input("logits", {7, 10}, DType::f32);
  const auto labels = g.label("labels", {7}, DType::i32);
  const auto loss = g.softmax_xent(logits, labels);
  CpuExecutor<double> exec(g);
  sg::test::fill_uniform(exec.tensor(logits).real, rng, -4, 4);
  std::uniform_int_distribution<std::int32_t> label(0, 9);
  for (auto& y : exec.tensor(labels).i32) y = label(rng);
  exec.run();
  // F.nll_loss(F.log_softmax(z, 1), y): mean over rows of -(z_y - log sum exp z).
  double nll = 0;
  for (std::size_t row = 0; row < 7; ++row) {
    const double* z = exec.tensor(logits).real.data() + row * 10;
    double sum_exp = 0;
    for (int k = 0; k < 10; ++k) sum_exp += std::exp(z[k]);
    nll -= z[exec.tensor(labels).i32[row]] - std::log(sum_exp);
  }
  CHECK(exec.tensor(loss).real[0] == doctest::Approx(nll / 7).epsilon(1e-12));
}
