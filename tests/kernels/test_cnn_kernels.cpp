// Issue 22's own CNN kernels on the GPU against the CPU reference backend:
// max-pool forward alone and with the relu after it and the dropout2d before
// it; its backward alone and with relu_backward before and
// dropout2d_backward after it (with and without the intermediates read
// outside the launch); dropout2d alone; the conv bias gradient fused with
// its SGD update (alone: test_channel_sum_shapes.cpp); the conv weights' SGD updates in one launch; Adam
// on conv-shaped parameters. Each graph runs through the CUDA program (the
// real cover, so the test also checks which lowering took it) and through
// CpuExecutor<float>, which rounds every f16 / bf16 value a node writes as
// the GPU stores it: pooling and dropout must match bit for bit (they only
// select, scale and add in the reference's order); sums and updates within a
// relative error by norm. Outputs are poisoned first (an unwritten element
// reads NaN, and NaN never passes relative_error).
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <string>

#include "ops/cuda/cuda_check.hpp"
#include "runtime/cpu/cpu_executor.hpp"
#include "runtime/cuda/cuda_program.hpp"
#include "runtime/tensor_blob.hpp"
#include "tests/kernels/twin_run.hpp"
#include "tests/runtime/test_support.hpp"
#include "tests/support/core_only_skips.hpp"

using namespace sg;

namespace {

using sg::test::Fill;
using sg::test::pick;
using sg::test::TwinRun;

// A random pooling problem: odd sizes, kernel 1..4, stride 1..4 (overlapping,
// exact and gapped windows).
struct PoolCase {
  Shape x;
  Pool2dAttrs pool;
  DropoutAttrs dropout;
  std::int32_t step = 0;
  Shape pooled() const {
    return {x[0], x[1], (x[2] - pool.kernel) / pool.stride + 1, (x[3] - pool.kernel) / pool.stride + 1};
  }
};

// With `tiled`, windows that tile the plane (kernel == stride, no rows or
// columns left over: the backward's one-thread-per-window kernel).
PoolCase random_pool_case(std::mt19937_64& rng, bool tiled = false) {
  PoolCase c;
  c.pool.kernel = pick(rng, 1, 4);
  c.pool.stride = tiled ? c.pool.kernel : pick(rng, 1, 4);
  c.x = {pick(rng, 1, 5), pick(rng, 1, 9), c.pool.kernel + pick(rng, 0, 14), c.pool.kernel + pick(rng, 0, 14)};
  if (tiled)
    for (std::size_t d : {2, 3}) c.x[d] = c.x[d] / c.pool.kernel * c.pool.kernel;
  c.dropout = {std::vector<double>{0.0, 0.25, 0.5, 0.9}[rng() % 4], rng(), pick(rng, 0, 5)};
  c.step = static_cast<std::int32_t>(pick(rng, 0, 5000));
  return c;
}

const std::vector<DType> kDtypes = {DType::f32, DType::f16, DType::bf16};

}  // namespace

TEST_CASE("max_pool2d forward, alone and with its relu and dropout2d folded in, matches the CPU bit for bit") {
  auto rng = sg::test::fresh_rng();
  for (int trial = 0; trial < 12; ++trial)
    for (const DType dtype : kDtypes) {
      const PoolCase c = random_pool_case(rng, /*tiled=*/trial % 3 == 0);  // a third: the packed kernel
      const Fill fill{trial % 2 == 0};
      CAPTURE(sg::test::last_seed());
      CAPTURE(dtype_name(dtype));
      CAPTURE(fmt::format("x {} kernel {} stride {} p {} step {} ties {}", fmt::join(c.x, "x"), c.pool.kernel,
                          c.pool.stride, c.dropout.p, c.step, fill.ties));
      // 0: pool alone; 1: pool + relu; 2: dropout2d + pool + relu, only the relu
      // read after; 3: the same with the dropout2d and pool outputs read too.
      for (int variant = 0; variant < 4; ++variant) {
        CAPTURE(variant);
        Graph g;
        const ValueId x = g.input("x", c.x, dtype);
        ValueId in = x, dropped = -1;
        if (variant >= 2) {
          const ValueId step = g.state("step", {1}, DType::i32);
          in = dropped = g.append_node(OpKind::dropout2d, {x, step}, c.dropout).front();
        }
        const ValueId pooled = g.append_node(OpKind::max_pool2d, {in}, c.pool).front();
        ValueId relu = -1;
        if (variant >= 1) relu = g.append_node(OpKind::relu, {pooled}, NoAttrs{}).front();
        std::vector<ValueId> checked = {variant == 0 ? pooled : relu};
        if (variant == 3) checked = {dropped, pooled, relu};
        for (ValueId v : checked) g.mark_output(v);
        TwinRun run(std::move(g), rng, fill, c.step);
        const auto launches = run.lowerings();
        CHECK(launches == std::vector<std::string>{"max_pool2d"});
        for (ValueId v : checked) {
          CAPTURE(run.graph().value(v).name);
          CHECK(run.error(v) == 0.0);
        }
      }
    }
}

TEST_CASE("max_pool2d_backward, alone and with relu_backward and dropout2d_backward folded in, matches the CPU") {
  // Every chain: [relu_backward ->] max_pool2d_backward [-> relu_backward]
  // [-> dropout2d_backward], each with only its result read after the launch
  // and once with every intermediate read too, a third of the cases with
  // windows that tile the plane. Bit for bit.
  struct Chain {
    bool relu_before, relu_after, dropout, intermediates;
  };
  std::vector<Chain> chains;
  for (int bits = 0; bits < 8; ++bits) chains.push_back({(bits & 1) != 0, (bits & 2) != 0, (bits & 4) != 0, false});
  chains.push_back({true, true, true, true});
  chains.push_back({true, false, true, true});
  chains.push_back({false, true, false, true});
  auto rng = sg::test::fresh_rng();
  for (int trial = 0; trial < 12; ++trial)
    for (const DType dtype : kDtypes) {
      const PoolCase c = random_pool_case(rng, /*tiled=*/trial % 3 == 0);
      CAPTURE(sg::test::last_seed());
      CAPTURE(dtype_name(dtype));
      CAPTURE(fmt::format("x {} kernel {} stride {} p {} step {}", fmt::join(c.x, "x"), c.pool.kernel, c.pool.stride,
                          c.dropout.p, c.step));
      for (std::size_t k = 0; k < chains.size(); ++k) {
        const Chain& chain = chains[k];
        CAPTURE(fmt::format("relu before {} relu after {} dropout {} intermediates {}", chain.relu_before,
                            chain.relu_after, chain.dropout, chain.intermediates));
        Graph g;
        const ValueId dy = g.input("dy", c.pooled(), dtype);
        const ValueId x = g.input("x", c.x, dtype);  // the pooling's input: its argmax
        std::vector<ValueId> intermediates;
        ValueId grad = dy;
        if (chain.relu_before) {
          const ValueId relu_out = g.input("relu_before_out", c.pooled(), dtype);
          grad = g.append_node(OpKind::relu_backward, {grad, relu_out}, NoAttrs{}).front();
          intermediates.push_back(grad);
        }
        grad = g.append_node(OpKind::max_pool2d_backward, {grad, x}, c.pool).front();
        intermediates.push_back(grad);
        if (chain.relu_after) {
          const ValueId relu_out = g.input("relu_after_out", c.x, dtype);
          grad = g.append_node(OpKind::relu_backward, {grad, relu_out}, NoAttrs{}).front();
          intermediates.push_back(grad);
        }
        if (chain.dropout) {
          const ValueId step = g.state("step", {1}, DType::i32);
          grad = g.append_node(OpKind::dropout2d_backward, {grad, step}, c.dropout).front();
        } else {
          intermediates.pop_back();  // the result itself
        }
        std::vector<ValueId> checked = {grad};
        if (chain.intermediates) checked.insert(checked.end(), intermediates.begin(), intermediates.end());
        for (ValueId v : checked) g.mark_output(v);
        // Every other chain draws small integers (windows full of ties for
        // the first-maximum rule), the others U(-2, 2); either way a relu
        // output <= 0 masks about half of the gradients.
        TwinRun run(std::move(g), rng, Fill{(k + static_cast<std::size_t>(trial)) % 2 == 0}, c.step);
        CHECK(run.lowerings() == std::vector<std::string>{"max_pool2d_backward"});
        for (ValueId v : checked) {
          CAPTURE(run.graph().value(v).name);
          CHECK(run.error(v) == 0.0);
        }
      }
    }
}

TEST_CASE("the first maximum of a window takes the gradient: a window of equal values routes it to its first element") {
  // Deterministic counterpart of the random tie checks: every x equal, so the
  // gradient must land on each window's top-left element only.
  for (const DType dtype : kDtypes) {
    CAPTURE(dtype_name(dtype));
    Graph g;
    const ValueId dy = g.input("dy", {1, 1, 2, 2}, dtype);
    const ValueId x = g.input("x", {1, 1, 5, 5}, dtype);
    const ValueId dx = g.append_node(OpKind::max_pool2d_backward, {dy, x}, Pool2dAttrs{3, 2}).front();
    g.mark_output(dx);
    std::mt19937_64 rng(1);
    TwinRun run(std::move(g), rng, Fill{false, 1.0, 1.0});  // x == 1 everywhere, dy == 1
    const auto got = run.gpu(dx);
    std::vector<float> expected(25, 0.f);
    for (const int at : {0, 2, 10, 12}) expected[static_cast<std::size_t>(at)] = 1.f;
    CHECK(got == expected);
    CHECK(run.cpu(dx) == expected);
  }
}

TEST_CASE("dropout2d and dropout2d_backward alone keep exactly the CPU reference's channels, in either layout") {
  auto rng = sg::test::fresh_rng();
  for (const bool channels_last : {false, true})
    for (const DType dtype : kDtypes)
      for (const std::int32_t step : {0, 1, 977}) {
        // [N,C,H,W], or [N,H,W,C] channels-last; step 977 takes examples of
        // more elements than one block's run (several blocks an example).
        const Shape nchw = step == 977 ? Shape{3, 40, 12, 13}
                                       : Shape{pick(rng, 1, 9), pick(rng, 1, 33), pick(rng, 1, 13), pick(rng, 1, 13)};
        const Shape shape = channels_last ? Shape{nchw[0], nchw[2], nchw[3], nchw[1]} : nchw;
        const DropoutAttrs attrs{0.4, 0x1234567890abcdefull, 2, channels_last};
        CAPTURE(sg::test::last_seed());
        CAPTURE(fmt::format("{} {} step {}{}", dtype_name(dtype), fmt::join(shape, "x"), step,
                            channels_last ? " channels-last" : ""));
        Graph g;
        const ValueId x = g.input("x", shape, dtype);
        const ValueId dy = g.input("dy", shape, dtype);
        const ValueId s = g.state("step", {1}, DType::i32);
        const ValueId y = g.append_node(OpKind::dropout2d, {x, s}, attrs).front();
        const ValueId dx = g.append_node(OpKind::dropout2d_backward, {dy, s}, attrs).front();
        g.mark_output(y);
        g.mark_output(dx);
        // Inputs in [0.5, 1.5]: never zero, so every differing keep bit shows.
        TwinRun run(std::move(g), rng, Fill{false, 0.5, 1.5}, step);
        CHECK(run.lowerings() == std::vector<std::string>{"dropout2d", "dropout2d"});
        CHECK(run.error(y) == 0.0);
        CHECK(run.error(dx) == 0.0);
        // Whole channels: within a plane, all kept or all zero.
        const auto got = run.gpu(y);
        const std::int64_t channels = nchw[1], plane = nchw[2] * nchw[3];
        int mixed = 0;  // elements whose keep bit differs from their channel's first
        for (std::int64_t n = 0; n < nchw[0]; ++n)
          for (std::int64_t c = 0; c < channels; ++c) {
            const auto at = [&](std::int64_t k) {
              return got[static_cast<std::size_t>(channels_last ? (n * plane + k) * channels + c
                                                                 : (n * channels + c) * plane + k)];
            };
            const bool dropped = at(0) == 0.f;
            for (std::int64_t k = 1; k < plane; ++k) mixed += (at(k) == 0.f) != dropped;
          }
        CHECK(mixed == 0);
      }
}

TEST_CASE("a conv bias's channel_sum [+ cast] + sgd_update run as one launch and match the CPU reference") {
  SG_SKIP_IF_CORE_ONLY("fused_update's channel_sum_sgd");
  auto rng = sg::test::fresh_rng();
  // (gradient dtype, bias dtype): same dtype, or an fp32 master bias through a cast.
  const std::vector<std::pair<DType, DType>> types = {
      {DType::f32, DType::f32}, {DType::f16, DType::f32}, {DType::bf16, DType::f32}, {DType::f16, DType::f16}};
  for (const auto& [grad_type, bias_type] : types)
    for (const double momentum : {0.0, 0.5}) {
      const Shape shape{pick(rng, 1, 70), pick(rng, 1, 40), pick(rng, 1, 20), pick(rng, 1, 20)};
      CAPTURE(sg::test::last_seed());
      CAPTURE(fmt::format("grad {} bias {} momentum {} dy {}", dtype_name(grad_type), dtype_name(bias_type), momentum,
                          fmt::join(shape, "x")));
      Graph g;
      const ValueId dy = g.input("dy", shape, grad_type);
      const ValueId bias = g.param("b", {shape[1]}, bias_type);
      std::optional<ValueId> velocity;
      if (momentum > 0) velocity = g.state("vel_b", {shape[1]}, bias_type);
      ValueId grad = g.append_node(OpKind::channel_sum, {dy}, NoAttrs{}).front();
      if (grad_type != bias_type) grad = g.append_node(OpKind::cast, {grad}, CastAttrs{bias_type}).front();
      g.sgd_update(bias, grad, momentum, 1e-3, velocity);
      TwinRun run(std::move(g), rng, Fill{false, 0.0, 1.0}, 0, 0.01);
      CHECK(run.lowerings() == std::vector<std::string>{"channel_sum_sgd"});
      // The sum is rounded to the gradient's dtype before the update, on both
      // backends; summed in another order, it may round to the neighbouring
      // f16 / bf16 value, which the update (lr * grad dominates) carries into
      // the bias and the velocity: one ulp of the gradient's dtype at most.
      const double tolerance = grad_type == DType::f32 ? 1e-4 : grad_type == DType::bf16 ? 1e-2 : 2e-3;
      CHECK(run.error(bias) < tolerance);
      if (velocity) CHECK(run.error(*velocity) < tolerance);
    }
}

TEST_CASE("every parameter's [cast +] sgd_update (plain, momentum, Nesterov) runs in one multi-tensor launch and matches the CPU reference") {
  auto rng = sg::test::fresh_rng();
  const std::vector<std::pair<DType, DType>> types = {
      {DType::f32, DType::f32}, {DType::f16, DType::f32}, {DType::bf16, DType::f32}, {DType::f16, DType::f16}};
  for (const auto& [grad_type, weight_type] : types)
    for (const auto& [momentum, nesterov] : std::vector<std::pair<double, bool>>{{0.0, false}, {0.5, false}, {0.5, true}}) {
      CAPTURE(sg::test::last_seed());
      CAPTURE(fmt::format("grad {} weight {} momentum {} nesterov {}", dtype_name(grad_type), dtype_name(weight_type),
                          momentum, nesterov));
      Graph g;
      // Two conv weights of odd sizes (one larger than a block's chunk), a linear weight, a bias.
      const std::vector<Shape> shapes = {
          {pick(rng, 1, 30), pick(rng, 1, 9), 5, 5}, {64, 33, 3, 3}, {pick(rng, 1, 40), 17}, {pick(rng, 1, 70)}};
      std::vector<ValueId> weights, velocities;
      for (std::size_t k = 0; k < shapes.size(); ++k) {
        const ValueId grad_in = g.input(fmt::format("grad_in{}", k), shapes[k], grad_type);
        const ValueId w = g.param(fmt::format("w{}", k), shapes[k], weight_type);
        std::optional<ValueId> velocity;
        if (momentum > 0) velocity = g.state(fmt::format("vel_w{}", k), shapes[k], weight_type);
        ValueId grad = grad_in;
        if (grad_type != weight_type) grad = g.append_node(OpKind::cast, {grad_in}, CastAttrs{weight_type}).front();
        std::vector<ValueId> in{w, grad};
        if (velocity) in.push_back(*velocity);
        g.append_node(OpKind::sgd_update, in, SgdUpdateAttrs{momentum, 1e-3, nesterov});
        weights.push_back(w);
        if (velocity) velocities.push_back(*velocity);
      }
      // The step advance rides on the launch.
      const ValueId step = g.state("step", {1}, DType::i32);
      g.advance_step(step);
      TwinRun run(std::move(g), rng, Fill{}, 41, 0.01);
      CHECK(run.lowerings() == std::vector<std::string>{"sgd_multi_tensor"});
      CHECK(run.gpu_i32(step) == 42);
      CHECK(run.cpu_i32(step) == 42);
      const double tolerance = weight_type == DType::f16 ? 2e-3 : 1e-6;
      for (ValueId v : weights) CHECK(run.error(v) < tolerance);
      for (ValueId v : velocities) CHECK(run.error(v) < tolerance);
    }
}

TEST_CASE("Adam on conv-shaped parameters (update_multi_tensor) matches the CPU reference") {
  auto rng = sg::test::fresh_rng();
  CAPTURE(sg::test::last_seed());
  Graph g;
  const ValueId step = g.state("step", {1}, DType::i32);
  std::vector<ValueId> updated;
  for (const Shape& shape : std::vector<Shape>{{20, 10, 5, 5}, {7, 3, 3, 3}}) {
    const std::string k = std::to_string(updated.size());
    const ValueId w = g.param("w" + k, shape, DType::f32);
    const ValueId grad = g.input("grad" + k, shape, DType::f32);
    const ValueId m = g.state("adam_m_w" + k, shape, DType::f32);
    const ValueId v = g.state("adam_v_w" + k, shape, DType::f32);
    g.append_node(OpKind::adam_update, {w, grad, m, v, step}, AdamUpdateAttrs{});
    updated.insert(updated.end(), {w, m});
  }
  // The second moment must stay non-negative: fill it with [0, 1].
  TwinRun run(std::move(g), rng, Fill{false, 0.0, 1.0}, 3, 1e-3);
  CHECK(run.lowerings() == std::vector<std::string>{"update_multi_tensor"});
  for (ValueId v : updated) CHECK(run.error(v) < 1e-5);
}
