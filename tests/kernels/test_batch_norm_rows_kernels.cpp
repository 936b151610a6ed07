// Issue 37's batch normalisation of tall [rows, C] values (channels-last
// activations as their [N*H*W, C] view, BatchNorm1d): the whole-GPU rows
// path (ops/cuda/batch_norm_rows.cu) called directly against the CPU
// reference in double, on the residual CNN's shapes (100352 x 32, 25088 x 64,
// 6272 x 128), the threshold's row count and random ones up to 110000, 1 to
// 200 channels (odd counts and misaligned tensors move one value at a time),
// in f32, f16 and bf16, with every fusion of the launch: the running
// statistics, the residual add, the ReLU; the backward's relu_out mask and
// dy_other, and each of its outputs left out in turn. Outputs and the
// workspace are poisoned (NaN) before each launch, so an element not written
// fails (NaN never passes); relative errors by norm within a few roundings
// of each type (dgamma and dbeta, sums that cancel: against their terms'
// magnitudes); the same bits on a second launch and on CUDA graph replays
// (the finish counter left 0). Each case both ways the path runs: one
// cooperative launch (on an H200 the f16 model shapes hold every row in
// registers, the f32 ones and the backward's 100352 x 32 read some rows
// again) and the two launches. Then channels_last [N, H, W, C] graphs
// through the lowering (TwinRun), fusions included.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <map>
#include <optional>

#include "tests/kernels/batch_norm_rows_test_support.hpp"
#include "tests/kernels/twin_run.hpp"

using namespace sg;
using namespace sg::test::batch_norm_rows;
using sg::test::TwinRun;
using sg::test::channels_last::bit_difference;
using sg::test::channels_last::for_each_type;
using sg::test::channels_last::type_name;

namespace {

// The model's shapes, the threshold, misaligned tensors, and a random row count for each channel count.
std::vector<RowsShape> shapes(std::mt19937_64& rng) {
  const std::int64_t min = cuda::kBatchNormRowsMinRows;
  std::vector<RowsShape> list = {{100352, 32}, {25088, 64}, {6272, 128}, {min, 5}, {min + 1, 32, 1}};
  for (const std::int64_t c : {1, 3, 32, 33, 64, 128, 200})
    list.push_back({sg::test::pick(rng, min + 1, 110000), c, c == 64 ? std::size_t(1) : std::size_t(0)});
  return list;
}

// Each channel's error against the sum of its terms' magnitudes (NaN fails).
void check_channel_sums(const std::vector<float>& got, const std::vector<double>& want,
                        const std::vector<double>& terms, double tolerance) {
  REQUIRE(got.size() == want.size());
  for (std::size_t c = 0; c < got.size(); ++c) {
    CAPTURE(c);
    CHECK(std::abs(double(got[c]) - want[c]) <= tolerance * terms[c]);
  }
}

template <typename T>
void check_forward(const RowsCase<T>& k, double tolerance) {
  std::vector<double> normalised;
  const ForwardOut want = k.reference_forward(normalised);
  for (const bool stats : {false, true})
    for (const bool residual : {false, true})
      for (const bool relu : {false, true}) {
        CAPTURE(fmt::format("forward: running statistics {} residual {} relu {}", stats, residual, relu));
        const ForwardOut got = k.forward(stats, residual, relu);
        CHECK(sg::test::relative_error(got.y, k.fused_output(normalised, residual, relu)) <= tolerance);
        if (!stats) continue;
        // f32 statistics of T's values: f32's tolerance whatever T.
        CHECK(sg::test::relative_error(got.running_mean, want.running_mean) <= 2e-5);
        CHECK(sg::test::relative_error(got.running_var, want.running_var) <= 2e-5);
      }
  const ForwardOut alone = k.stats_update();
  CHECK(sg::test::relative_error(alone.running_mean, want.running_mean) <= 2e-5);
  CHECK(sg::test::relative_error(alone.running_var, want.running_var) <= 2e-5);
}

template <typename T>
void check_backward(const RowsCase<T>& k, double tolerance) {
  const std::array<BackwardVariant, 8> variants = {{{false, false, true, true, true},
                                                    {true, false, true, true, true},
                                                    {false, true, true, true, true},
                                                    {true, true, true, true, true},
                                                    {true, true, false, true, true},
                                                    {false, false, true, false, false},
                                                    {false, true, true, true, false},
                                                    {true, false, false, false, true}}};
  std::map<int, BackwardReference> references;  // by relu * 2 + other
  for (const BackwardVariant& v : variants) {
    CAPTURE(fmt::format("backward: relu_out {} dy_other {} dx {} dgamma {} dbeta {}", v.relu, v.other, v.dx, v.dgamma,
                        v.dbeta));
    const int key = int(v.relu) * 2 + int(v.other);
    if (!references.count(key)) references.emplace(key, k.reference_backward(v.relu, v.other));
    const BackwardReference& want = references.at(key);
    const BackwardOut got = k.backward(v);
    if (v.dx) CHECK(sg::test::relative_error(got.dx, want.dx) <= tolerance);
    if (v.dgamma) check_channel_sums(got.dgamma, want.dgamma, want.dgamma_terms, tolerance);
    if (v.dbeta) check_channel_sums(got.dbeta, want.dbeta, want.dbeta_terms, tolerance);
  }
}

// The same bits on a second launch of each (the same launch site: its counter and workspace again).
template <typename T>
void check_repeatable(const RowsCase<T>& k) {
  const ForwardOut f1 = k.forward(true, true, true), f2 = k.forward(true, true, true);
  CHECK(bit_difference(f2.y, f1.y) == "");
  CHECK(bit_difference(f2.running_mean, f1.running_mean) == "");
  CHECK(bit_difference(f2.running_var, f1.running_var) == "");
  const BackwardVariant all{true, true, true, true, true};
  const BackwardOut b1 = k.backward(all), b2 = k.backward(all);
  CHECK(bit_difference(b2.dx, b1.dx) == "");
  CHECK(bit_difference(b2.dgamma, b1.dgamma) == "");
  CHECK(bit_difference(b2.dbeta, b1.dbeta) == "");
}

}  // namespace

TEST_CASE("batch_norm's rows path follows the CPU reference on [rows, C] values, every fusion, the same bits again") {
  auto rng = sg::test::fresh_rng();
  CAPTURE(sg::test::last_seed());
  for_each_type([&](auto tag) {
    using T = decltype(tag);
    const double tolerance = sg::test::sum_order_tolerance(dtype_of<T>());
    for (const RowsShape& shape : shapes(rng)) {
      CAPTURE(
          fmt::format("{} rows {} channels {} offset {}", type_name<T>(), shape.rows, shape.channels, shape.offset));
      RowsCase<T> k(shape, rng);
      for (const bool cooperative : {true, false}) {
        CAPTURE(cooperative);
        k.set_cooperative(cooperative);
        check_forward(k, tolerance);
        check_backward(k, tolerance);
        check_repeatable(k);
      }
    }
  });
}

TEST_CASE("batch_norm's rows path keeps the one-pass statistics' precision when the mean is far from 0") {
  // Values in U(10, 11): a variance 1200 times below the squared mean (the
  // shift by the channel's row-0 value keeps f32's digits).
  auto rng = sg::test::fresh_rng();
  CAPTURE(sg::test::last_seed());
  for (const RowsShape& shape : std::vector<RowsShape>{{100352, 32}, {sg::test::pick(rng, 2049, 110000), 33}}) {
    CAPTURE(fmt::format("rows {} channels {}", shape.rows, shape.channels));
    RowsCase<float> k(shape, rng, 10.0, 11.0);
    for (const bool cooperative : {true, false}) {
      CAPTURE(cooperative);
      k.set_cooperative(cooperative);
      check_forward(k, 1e-4);
      check_backward(k, 1e-4);
    }
  }
}

TEST_CASE("batch_norm's rows path is for tall plane-1 shapes only: a workspace for those alone") {
  const std::int64_t min = cuda::kBatchNormRowsMinRows;
  CHECK(cuda::batch_norm_workspace_bytes({min - 1, 32, 1}) == 0);
  CHECK(cuda::batch_norm_workspace_bytes({min, 32, 2}) == 0);  // NCHW planes: the per-channel kernels
  CHECK(cuda::batch_norm_workspace_bytes({min, 32, 1}) > 0);
  CHECK(cuda::batch_norm_workspace_bytes({100352, 32, 1}) >= std::size_t(100352 / 512) * 4 * 32 * sizeof(float));
}

TEST_CASE("batch_norm's rows path replays in a CUDA graph: the finish counter left 0, the same bits every replay") {
  // Both ways: the cooperative launch as a graph node, and the two launches' counter.
  auto rng = sg::test::fresh_rng();
  CAPTURE(sg::test::last_seed());
  for_each_type([&](auto tag) {
    using T = decltype(tag);
    CAPTURE(type_name<T>());
    for (const bool cooperative : {true, false}) {
      CAPTURE(cooperative);
      RowsCase<T> k({25088, 64}, rng);
      k.set_cooperative(cooperative);
      const std::size_t n = k.count(), c = k.channels();
      const Tensor<T> y(n), dx(n), dgamma(c), dbeta(c);
      const BackwardVariant all{true, true, true, true, true};
      // The graph poisons the workspace before each launch (RowsCase::scratch):
      // a counter not left 0 would leave the per-channel values NaN.
      const auto enqueue = [&] {
        k.launch_forward(y.get(), nullptr, nullptr, true, true);
        k.launch_backward(all, dx.get(), dgamma.get(), dbeta.get());
      };
      enqueue();
      const std::array<std::vector<float>, 4> first = {y.download(), dx.download(), dgamma.download(),
                                                       dbeta.download()};
      for (const auto& v : first) CHECK(std::isfinite(sg::test::relative_error(v, v)));
      cuda::begin_capture(k.stream());
      enqueue();
      const cuda::GraphExec graph(cuda::end_capture(k.stream()));
      for (int replay = 0; replay < 3; ++replay) {
        CAPTURE(replay);
        graph.launch(k.stream());
        CHECK(bit_difference(y.download(), first[0]) == "");
        CHECK(bit_difference(dx.download(), first[1]) == "");
        CHECK(bit_difference(dgamma.download(), first[2]) == "");
        CHECK(bit_difference(dbeta.download(), first[3]) == "");
      }
    }
  });
}

namespace {

// Per channel of [rows, C] values: sum |dy * xhat| and sum |dy| (in double).
std::pair<std::vector<double>, std::vector<double>> rows_term_magnitudes(const std::vector<float>& x,
                                                                         const std::vector<float>& dy,
                                                                         std::int64_t channels) {
  const std::int64_t rows = static_cast<std::int64_t>(x.size()) / channels;
  const auto xt = planes_of(x, rows, channels), gt = planes_of(dy, rows, channels);
  std::vector<double> dgamma(static_cast<std::size_t>(channels)), dbeta(dgamma.size());
  for (std::int64_t c = 0; c < channels; ++c) {
    const auto m = ref::channel_moments(xt.data(), 1, channels, rows, c, kEps);
    for (std::int64_t k = c * rows; k < (c + 1) * rows; ++k) {
      dgamma[static_cast<std::size_t>(c)] += std::abs(gt[std::size_t(k)] * (xt[std::size_t(k)] - m.mean) * m.rstd);
      dbeta[static_cast<std::size_t>(c)] += std::abs(gt[std::size_t(k)]);
    }
  }
  return {dgamma, dbeta};
}

}  // namespace

TEST_CASE("channels_last batch_norm with its residual add, ReLU and backward fusions lowers to the rows path") {
  // [N, H, W, C] of 2304 and 6272 rows: above the threshold. dy's values in
  // U(-1, 1.5) keep dbeta (a sum of up to 6272 of them) within f16's range.
  auto rng = sg::test::fresh_rng();
  for (const Shape& shape : std::vector<Shape>{{16, 12, 12, 32}, {8, 28, 28, 16}})
    for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
      CAPTURE(sg::test::last_seed());
      CAPTURE(fmt::format("{} x {}", dtype_name(dtype), fmt::join(shape, "x")));
      const Shape channels{shape[3]};
      Graph g;
      const ValueId x = g.input("x", shape, dtype);
      const ValueId gamma = g.input("gamma", channels, dtype);
      const ValueId mean = g.state("running_mean", channels, DType::f32);
      const ValueId var = g.state("running_var", channels, DType::f32);
      const BatchNormAttrs attrs{1e-5, 0.1, true};
      g.append_node(OpKind::batch_norm_stats_update, {x, mean, var}, attrs);
      ValueId y = g.append_node(OpKind::batch_norm, {x, gamma, g.input("beta", channels, dtype)}, attrs).front();
      y = g.append_node(OpKind::add, {y, g.input("skip", shape, dtype)}, NoAttrs{}).front();
      const ValueId r = g.relu(y);
      const ValueId dr = g.input("dr", shape, dtype), dr_other = g.input("dr_other", shape, dtype);
      const ValueId grad = g.append_node(OpKind::add, {dr, dr_other}, NoAttrs{}).front();
      const auto grads = g.append_node(OpKind::batch_norm_backward, {g.relu_backward(grad, r), x, gamma}, attrs);
      g.mark_output(r);
      for (ValueId v : grads) g.mark_output(v);
      TwinRun run(std::move(g), rng, sg::test::Fill{false, -1.0, 1.5});
      CHECK(run.lowerings() == std::vector<std::string>(2, "batch_norm"));
      const double tolerance = sg::test::sum_order_tolerance(dtype);
      for (ValueId v : {r, grads[0], mean, var}) {
        CAPTURE(run.graph().value(v).name);
        CHECK(run.error(v) <= tolerance);
      }
      std::vector<float> masked = run.cpu(dr);
      const auto other = run.cpu(dr_other), relu_out = run.cpu(r);
      for (std::size_t i = 0; i < masked.size(); ++i) masked[i] = relu_out[i] > 0 ? masked[i] + other[i] : 0.f;
      const auto [dgamma_terms, dbeta_terms] = rows_term_magnitudes(run.cpu(x), masked, shape[3]);
      std::vector<double> cpu_dgamma, cpu_dbeta;
      for (float v : run.cpu(grads[1])) cpu_dgamma.push_back(v);
      for (float v : run.cpu(grads[2])) cpu_dbeta.push_back(v);
      check_channel_sums(run.gpu(grads[1]), cpu_dgamma, dgamma_terms, tolerance);
      check_channel_sums(run.gpu(grads[2]), cpu_dbeta, dbeta_terms, tolerance);
      const auto first_r = run.gpu(r), first_dx = run.gpu(grads[0]), first_dgamma = run.gpu(grads[1]);
      run.rerun();
      CHECK(bit_difference(run.gpu(r), first_r) == "");
      CHECK(bit_difference(run.gpu(grads[0]), first_dx) == "");
      CHECK(bit_difference(run.gpu(grads[1]), first_dgamma) == "");
    }
}
