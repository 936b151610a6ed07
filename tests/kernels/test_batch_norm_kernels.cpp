// Issue 37's batch normalisation kernels on the GPU against the CPU reference
// backend (TwinRun, outputs poisoned first): the training normalisation, its
// backward (dx, dgamma, dbeta), the running-statistics update in place (f32
// state) and inference, on [N, C] and [N, C, H, W] values from 3 to 50k
// values per channel (dbeta, the sum of a channel's dy in U(0.5, 1.5), stays
// below f16's 65504), in f32, f16 and bf16, planes below and above a warp. The per-channel block sums add
// in another order than the reference: relative errors by norm, a few
// roundings of each type (dgamma and dbeta, sums that cancel: against their
// terms' magnitudes); the same bits again on a second run. The running
// statistics' update before the training normalisation of the same X (as a
// model builds them) runs as one launch, with the same results; so do a
// residual add and the ReLU after a batch_norm, and the add of two gradients
// and the relu_backward before its backward.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <optional>

#include "tests/kernels/twin_run.hpp"
#include "tests/runtime/test_support.hpp"

using namespace sg;
using sg::test::Fill;
using sg::test::TwinRun;

namespace {

// Per channel: sum |dy * xhat| and sum |dy| over its values (in double).
struct TermSums {
  std::vector<double> dgamma, dbeta;
};
TermSums term_magnitudes(const std::vector<float>& x, const std::vector<float>& dy, const Shape& shape) {
  const std::int64_t n = shape[0], channels = shape[1], plane = element_count(shape) / (n * channels);
  TermSums t{std::vector<double>(static_cast<std::size_t>(channels)), std::vector<double>(static_cast<std::size_t>(channels))};
  for (std::int64_t c = 0; c < channels; ++c) {
    const auto each = [&](auto&& f) {
      for (std::int64_t b = 0; b < n; ++b)
        for (std::int64_t k = 0; k < plane; ++k) f(static_cast<std::size_t>((b * channels + c) * plane + k));
    };
    double sum = 0, squares = 0;
    each([&](std::size_t i) { sum += x[i]; });
    const double m = sum / double(n * plane);
    each([&](std::size_t i) { squares += (x[i] - m) * (x[i] - m); });
    const double rstd = 1.0 / std::sqrt(squares / double(n * plane) + 1e-5);
    each([&](std::size_t i) {
      t.dgamma[static_cast<std::size_t>(c)] += std::abs(dy[i] * (x[i] - m) * rstd);
      t.dbeta[static_cast<std::size_t>(c)] += std::abs(double(dy[i]));
    });
  }
  return t;
}

}  // namespace

TEST_CASE("batch_norm's four ops follow the CPU reference on [N, C] and [N, C, H, W] values") {
  auto rng = sg::test::fresh_rng();
  const std::vector<Shape> shapes = {{3, 3}, {64, 40}, {3, 5, 4, 4}, {32, 16, 14, 14}, {64, 4, 28, 28}};
  for (const Shape& shape : shapes)
    for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
      CAPTURE(sg::test::last_seed());
      CAPTURE(fmt::format("{} x {}", dtype_name(dtype), fmt::join(shape, "x")));
      const Shape channels{shape[1]};
      Graph g;
      const ValueId x = g.input("x", shape, dtype);
      const ValueId dy = g.input("dy", shape, dtype);
      const ValueId gamma = g.input("gamma", channels, dtype);
      const ValueId beta = g.input("beta", channels, dtype);
      const ValueId mean = g.state("running_mean", channels, DType::f32);
      const ValueId var = g.state("running_var", channels, DType::f32);
      const BatchNormAttrs attrs{1e-5, 0.1};
      const ValueId inferred = g.append_node(OpKind::batch_norm_inference, {x, gamma, beta, mean, var}, attrs).front();
      const ValueId y = g.append_node(OpKind::batch_norm, {x, gamma, beta}, attrs).front();
      const auto grads = g.append_node(OpKind::batch_norm_backward, {dy, x, gamma}, attrs);
      g.append_node(OpKind::batch_norm_stats_update, {x, mean, var}, attrs);
      g.mark_output(inferred);
      g.mark_output(y);
      for (ValueId v : grads) g.mark_output(v);
      // U(0.5, 1.5) for every value: running variances > 0.
      TwinRun run(std::move(g), rng, Fill{false, 0.5, 1.5});
      CHECK(run.lowerings() == std::vector<std::string>(4, "batch_norm"));
      for (ValueId v : {inferred, y, grads[0], mean, var}) {
        CAPTURE(run.graph().value(v).name);
        CHECK(run.error(v) <= sg::test::sum_order_tolerance(dtype));
      }
      // dgamma = sum dy * xhat and dbeta = sum dy cancel (xhat's mean is 0):
      // each channel's error against the sum of its terms' magnitudes, which
      // their rounding scales with.
      const auto sums = term_magnitudes(run.cpu(x), run.cpu(dy), shape);
      for (int k : {1, 2}) {
        CAPTURE(run.graph().value(grads[static_cast<std::size_t>(k)]).name);
        const auto gpu = run.gpu(grads[static_cast<std::size_t>(k)]), cpu = run.cpu(grads[static_cast<std::size_t>(k)]);
        for (std::size_t c = 0; c < gpu.size(); ++c) {
          const double bound = k == 1 ? sums.dgamma[c] : sums.dbeta[c];
          CHECK(std::abs(double(gpu[c]) - cpu[c]) <= sg::test::sum_order_tolerance(dtype) * bound);  // NaN fails
        }
      }
      const auto first = run.gpu(grads[1]);
      run.rerun();
      CHECK(run.gpu(grads[1]) == first);
    }
}

TEST_CASE("the running statistics' update and the training normalisation of one X run as one launch") {
  auto rng = sg::test::fresh_rng();
  for (const Shape& shape : std::vector<Shape>{{64, 40}, {32, 16, 14, 14}})
    for (const DType dtype : {DType::f32, DType::f16}) {
      CAPTURE(sg::test::last_seed());
      CAPTURE(fmt::format("{} x {}", dtype_name(dtype), fmt::join(shape, "x")));
      const Shape channels{shape[1]};
      Graph g;
      const ValueId x = g.input("x", shape, dtype);
      const ValueId mean = g.state("running_mean", channels, DType::f32);
      const ValueId var = g.state("running_var", channels, DType::f32);
      const BatchNormAttrs attrs{1e-3, 0.3};
      g.append_node(OpKind::batch_norm_stats_update, {x, mean, var}, attrs);  // as the model builder orders them
      const ValueId y = g.append_node(OpKind::batch_norm, {x, g.input("gamma", channels, dtype),
                                                            g.input("beta", channels, dtype)},
                                      attrs)
                            .front();
      g.mark_output(y);
      TwinRun run(std::move(g), rng, Fill{false, 0.5, 1.5});
      CHECK(run.lowerings() == std::vector<std::string>{"batch_norm"});
      for (ValueId v : {y, mean, var}) {
        CAPTURE(run.graph().value(v).name);
        CHECK(run.error(v) <= sg::test::sum_order_tolerance(dtype));
      }
    }
}

TEST_CASE("batch_norm with a residual add and the ReLU after it, and its backward with the relu_backward and the add of two gradients before it, as one launch each") {
  // Odd planes too: 7x7 moves single values, 14x14 f16 packs of 4, 28x28 packs of 8. Each of these keeps a
  // channel's values in registers from the sums to the output (resident); 900x9x9 per channel (72900 single
  // values) is more than a cluster's threads hold so, and streams them twice instead: in f32 and bf16 only, as
  // its dbeta (a sum of ~50k gradients of U(0.5, 1.5)) leaves f16's range (f16 and bf16 share the kernels).
  auto rng = sg::test::fresh_rng();
  for (const bool residual : {false, true})
    for (const Shape& shape :
         std::vector<Shape>{{64, 40}, {16, 8, 7, 7}, {32, 16, 14, 14}, {64, 4, 28, 28}, {900, 4, 9, 9}})
      for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
        if (shape[0] == 900 && dtype == DType::f16) continue;
        CAPTURE(sg::test::last_seed());
        CAPTURE(fmt::format("{} x {} residual {}", dtype_name(dtype), fmt::join(shape, "x"), residual));
        const Shape channels{shape[1]};
        Graph g;
        const ValueId x = g.input("x", shape, dtype);
        const ValueId gamma = g.input("gamma", channels, dtype);
        const ValueId mean = g.state("running_mean", channels, DType::f32);
        const ValueId var = g.state("running_var", channels, DType::f32);
        const BatchNormAttrs attrs{1e-5, 0.1};
        g.append_node(OpKind::batch_norm_stats_update, {x, mean, var}, attrs);
        ValueId y = g.append_node(OpKind::batch_norm, {x, gamma, g.input("beta", channels, dtype)}, attrs).front();
        if (residual) y = g.append_node(OpKind::add, {y, g.input("skip", shape, dtype)}, NoAttrs{}).front();
        const ValueId r = g.relu(y);
        const ValueId dr = g.input("dr", shape, dtype);
        std::optional<ValueId> dr_other;
        ValueId grad = dr;
        if (residual) {
          dr_other = g.input("dr_other", shape, dtype);
          grad = g.append_node(OpKind::add, {dr, *dr_other}, NoAttrs{}).front();
        }
        const auto grads = g.append_node(OpKind::batch_norm_backward, {g.relu_backward(grad, r), x, gamma}, attrs);
        g.mark_output(r);
        for (ValueId v : grads) g.mark_output(v);
        // beta in U(0.5, 1.5) puts a third or so of the normalised values below 0 (fewer with the skip added).
        TwinRun run(std::move(g), rng, Fill{false, residual ? -1.0 : 0.5, 1.5});
        CHECK(run.lowerings() == std::vector<std::string>(2, "batch_norm"));
        for (ValueId v : {r, grads[0], mean, var}) {
          CAPTURE(run.graph().value(v).name);
          CHECK(run.error(v) <= sg::test::sum_order_tolerance(dtype));
        }
        std::vector<float> masked = run.cpu(dr);
        if (dr_other) {
          const auto other = run.cpu(*dr_other);
          for (std::size_t i = 0; i < masked.size(); ++i) masked[i] += other[i];
        }
        const auto relu_out = run.cpu(r);
        std::size_t zeros = 0;
        for (std::size_t i = 0; i < masked.size(); ++i)
          if (!(relu_out[i] > 0)) masked[i] = 0, ++zeros;
        CHECK(zeros > 0);
        CHECK(zeros < masked.size());
        const auto sums = term_magnitudes(run.cpu(x), masked, shape);
        for (int k : {1, 2}) {
          const auto gpu = run.gpu(grads[static_cast<std::size_t>(k)]), cpu = run.cpu(grads[static_cast<std::size_t>(k)]);
          for (std::size_t c = 0; c < gpu.size(); ++c) {
            const double bound = k == 1 ? sums.dgamma[c] : sums.dbeta[c];
            CHECK(std::abs(double(gpu[c]) - cpu[c]) <= sg::test::sum_order_tolerance(dtype) * bound);
          }
        }
      }
}

TEST_CASE("batch_norm's one-pass statistics keep their precision when the mean is far from 0") {
  // Values in U(10, 11): a variance 1200 times below the squared mean, where
  // a sum of squares without the shift would lose most of f32's digits.
  auto rng = sg::test::fresh_rng();
  for (const Shape& shape : std::vector<Shape>{{256, 24}, {64, 4, 28, 28}}) {
    CAPTURE(sg::test::last_seed());
    const Shape channels{shape[1]};
    Graph g;
    const ValueId x = g.input("x", shape, DType::f32);
    const ValueId gamma = g.input("gamma", channels, DType::f32);
    const ValueId mean = g.state("running_mean", channels, DType::f32);
    const ValueId var = g.state("running_var", channels, DType::f32);
    const BatchNormAttrs attrs{1e-5, 0.1};
    g.append_node(OpKind::batch_norm_stats_update, {x, mean, var}, attrs);
    const ValueId y = g.append_node(OpKind::batch_norm, {x, gamma, g.input("beta", channels, DType::f32)}, attrs).front();
    const auto grads = g.append_node(OpKind::batch_norm_backward, {g.input("dy", shape, DType::f32), x, gamma}, attrs);
    g.mark_output(y);
    g.mark_output(grads[0]);
    TwinRun run(std::move(g), rng, Fill{false, 10.0, 11.0});
    for (ValueId v : {y, grads[0], mean, var}) {
      CAPTURE(run.graph().value(v).name);
      CHECK(run.error(v) <= 1e-4);
    }
  }
}
