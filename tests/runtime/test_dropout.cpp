// Dropout: Philox4x32-10 against Random123's published known answers, the
// keep fraction and scale, masks keyed on (seed, stream, step), the backward
// recomputing the forward's mask, and a finite-difference gradient check at
// a fixed step (so a fixed mask).
#include <doctest/doctest.h>

#include <cmath>

#include "graph/autodiff.hpp"
#include "ops/philox.hpp"
#include "runtime/cpu/cpu_executor.hpp"
#include "tests/runtime/finite_differences.hpp"
#include "tests/runtime/test_support.hpp"

using namespace sg;

TEST_CASE("Philox4x32-10 reproduces Random123's known-answer vectors") {
  const auto check = [](philox::Bits4 ctr, std::uint32_t k0, std::uint32_t k1, philox::Bits4 expected) {
    const auto got = philox::philox4x32_10(ctr, k0, k1);
    for (int i = 0; i < 4; ++i) CHECK(got.v[i] == expected.v[i]);
  };
  check({{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}});
  check({{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu,
        {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}});
  check({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u,
        {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}});
}

namespace {

struct DropoutRun {
  std::vector<float> x, y, dy, dx;
};

// y = dropout(x), dx = dropout_backward(dy) at `step` on the CPU backend.
DropoutRun run_dropout(std::int64_t n, const DropoutAttrs& attrs, std::int32_t step) {
  Graph g;
  const auto x = g.input("x", {n}, DType::f32);
  const auto dy = g.input("dy", {n}, DType::f32);
  const auto s = g.state("step", {1}, DType::i32);
  const auto y = g.append_node(OpKind::dropout, {x, s}, attrs).front();
  const auto dx = g.append_node(OpKind::dropout_backward, {dy, s}, attrs).front();
  CpuExecutor<float> exec(g);
  auto rng = sg::test::fresh_rng();
  sg::test::fill_uniform(exec.tensor(x).real, rng, 0.5, 1.5);  // never 0, so a 0 output means dropped
  sg::test::fill_uniform(exec.tensor(dy).real, rng, 0.5, 1.5);
  exec.tensor(s).i32[0] = step;
  exec.run();
  return {exec.tensor(x).real, exec.tensor(y).real, exec.tensor(dy).real, exec.tensor(dx).real};
}

std::vector<bool> kept(const DropoutRun& r) {
  std::vector<bool> k(r.y.size());
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = r.y[i] != 0.f;
  return k;
}

}  // namespace

TEST_CASE("dropout keeps close to 1 - p of the elements, scaled by 1 / (1 - p)") {
  const std::int64_t n = 200000;
  for (double p : {0.1, 0.5, 0.9}) {
    INFO("p " << p);
    const auto r = run_dropout(n, {p, 1234, 1}, 7);
    std::int64_t kept_count = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      if (r.y[i] == 0.f) continue;
      ++kept_count;
      CHECK(r.y[i] == doctest::Approx(r.x[i] / (1.0 - p)).epsilon(1e-6));
    }
    const double fraction = static_cast<double>(kept_count) / n;
    // Binomial standard deviation sqrt(p (1-p) / n) <= 0.0012: 5 sigma.
    CHECK(std::abs(fraction - (1.0 - p)) < 5 * std::sqrt(p * (1 - p) / n));
  }
}

TEST_CASE("dropout's backward applies the forward's mask, and masks depend on seed, stream and step") {
  const std::int64_t n = 4099;  // not a multiple of 4: the last Philox block is partial
  const DropoutAttrs attrs{0.5, 42, 1};
  const auto a = run_dropout(n, attrs, 3);
  for (std::int64_t i = 0; i < n; ++i) {
    INFO("element " << i);
    CHECK((a.y[i] != 0.f) == (a.dx[i] != 0.f));
    if (a.dx[i] != 0.f) CHECK(a.dx[i] == doctest::Approx(a.dy[i] * 2.0).epsilon(1e-6));
  }
  CHECK(kept(run_dropout(n, attrs, 3)) == kept(a));  // the same (seed, stream, step): the same bits
  CHECK(kept(run_dropout(n, attrs, 4)) != kept(a));
  CHECK(kept(run_dropout(n, {0.5, 43, 1}, 3)) != kept(a));
  CHECK(kept(run_dropout(n, {0.5, 42, 2}, 3)) != kept(a));
}

TEST_CASE("dropout gradient at a fixed step (a fixed mask) against finite differences") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  const std::int64_t rows = 6, classes = 4;
  Graph g;
  const auto step = g.state("step", {1}, DType::i32);
  const auto x = g.input("x", {rows, 5}, DType::f32);
  const auto h = g.relu(g.linear(x, g.param("w1", {8, 5}, DType::f32), g.param("b1", {8}, DType::f32)));
  const auto d = g.append_node(OpKind::dropout, {h, step}, DropoutAttrs{0.3, 9, 1}).front();
  const auto logits = g.linear(d, g.param("w2", {classes, 8}, DType::f32), g.param("b2", {classes}, DType::f32));
  const auto labels = g.label("labels", {rows}, DType::i32);
  const auto loss = g.softmax_xent(logits, labels);
  const auto grads = append_backward(g, loss);

  CpuExecutor<double> exec(g);
  exec.tensor(step).i32[0] = 11;
  for (std::int64_t i = 0; i < rows; ++i) exec.tensor(labels).i32[i] = static_cast<std::int32_t>(i % classes);
  for (const auto& v : g.values())
    if (v.role == Role::param || v.role == Role::input) sg::test::fill_uniform(exec.tensor(v.id).real, rng);
  exec.run();
  const auto analytic_of = sg::test::analytic_gradients(exec, grads);
  int dropped = 0;
  for (double v : exec.tensor(d).real) dropped += v == 0.0 ? 1 : 0;
  CHECK(dropped > 0);  // the mask really removes something at this step
  for (const auto& [param, grad] : grads.of_param) {
    const std::vector<double> numeric = sg::test::numeric_gradient(exec, param, loss);
    INFO("parameter " << g.value(param).name);
    CHECK(sg::test::relative_error(analytic_of.at(param), numeric) < 1e-6);
  }
}

TEST_CASE("dropout rejects a p outside 0..1 and a step that is not an i32 scalar") {
  Graph g;
  const auto x = g.input("x", {4}, DType::f32);
  const auto s = g.state("step", {1}, DType::i32);
  CHECK_THROWS_WITH_AS(g.append_node(OpKind::dropout, {x, s}, DropoutAttrs{1.0, 0, 0}),
                       doctest::Contains("[0, 1)"), GraphError);
  const auto bad = g.state("bad", {2}, DType::i32);
  CHECK_THROWS_WITH_AS(g.append_node(OpKind::dropout, {x, bad}, DropoutAttrs{0.5, 0, 0}),
                       doctest::Contains("i32 [1]"), GraphError);
}
