// The small-batch forward kernel against the CPU reference: x W^T + b with
// and without ReLU, the batch gathered by the kernel itself (the folded
// fetch: X and the labels it writes out too), and the dependent-launch wait.
#include <doctest/doctest.h>

#include <array>
#include <cstdint>

#include "ops/cpu/reference_ops.hpp"
#include "ops/cuda/kernels.hpp"
#include "ops/cuda/fast_paths/small_batch_forward/small_batch_forward.hpp"
#include "tests/runtime/test_support.hpp"
#include "tests/support/activation_reference.hpp"
#include "tests/support/device_array.hpp"
#include "tests/support/late_linear_input.hpp"

using namespace sg;
using sg::test::DeviceArray;

namespace {

std::vector<double> reference_linear(const std::vector<float>& x, const std::vector<float>& w,
                                     const std::vector<float>& b, std::int64_t m, std::int64_t n, std::int64_t k,
                                     bool relu) {
  std::vector<double> xd(x.begin(), x.end()), wd(w.begin(), w.end()), bd(b.begin(), b.end()), y(std::size_t(m * n));
  ref::matmul(xd.data(), wd.data(), y.data(), m, n, k, false, true);
  ref::bias_add(y.data(), bd.data(), m, n, y.data());
  if (relu)
    for (auto& v : y) v = v > 0 ? v : 0;
  return y;
}

cuda::SmallBatchLinear linear_args(const __half* x, const __half* w, const __half* b, __half* y, std::int64_t m,
                                   std::int64_t n, std::int64_t k, bool relu) {
  cuda::SmallBatchLinear args;
  args.x = x;
  args.w = w;
  args.bias = b;
  args.y = y;
  args.batch = int(m);
  args.n = int(n);
  args.k = int(k);
  if (relu) args.activation = cuda::Activation::relu;
  return args;
}

}  // namespace

TEST_CASE("small-batch forward matches act(x W^T + b) on random shapes") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  // (batch, N, K, relu): one tile per warp or fewer, 784 = 49 tiles (warps with 6 and 7), the K limit
  for (auto [m, n, k, relu] : std::vector<std::array<std::int64_t, 4>>{
           {{32, 128, 784, 1}}, {{16, 48, 80, 1}}, {{32, 512, 512, 1}}, {{32, 1024, 1024, 0}}, {{16, 16, 16, 0}}}) {
    INFO(m << " x " << n << " x " << k << (relu ? " relu" : ""));
    REQUIRE(cuda::small_batch_linear_unsupported(m, n, k).empty());
    const auto x = sg::test::representable<__half>(sg::test::uniform(std::size_t(m * k), rng));
    const auto w = sg::test::representable<__half>(sg::test::uniform(std::size_t(n * k), rng));
    const auto b = sg::test::representable<__half>(sg::test::uniform(std::size_t(n), rng));
    for (const bool early : {true, false}) {
      INFO("weight loaded " << (early ? "before" : "after") << " the wait");
      DeviceArray<__half> dx(x), dw(w), db(b), y(std::size_t(m * n));  // y starts poisoned (NaN)
      cuda::SmallBatchLinear args = linear_args(dx.get(), dw.get(), db.get(), y.get(), m, n, k, relu != 0);
      args.load_weight_early = early;
      cuda::launch_small_batch_linear(args, nullptr, true);
      CHECK(sg::test::relative_error(y.download(), reference_linear(x, w, b, m, n, k, relu != 0)) < 2e-3);
    }
  }
  CHECK(!cuda::small_batch_linear_unsupported(64, 128, 128).empty());
  CHECK(!cuda::small_batch_linear_unsupported(32, 120, 128).empty());
  CHECK(!cuda::small_batch_linear_unsupported(32, 128, 2048).empty());
}

TEST_CASE("small-batch forward applies every activation, writing the pre-activation where asked") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  for (const cuda::Activation act : sg::test::kActivations) {
    INFO(cuda::activation_op_name(act));
    for (auto [m, n, k] : std::vector<std::array<std::int64_t, 3>>{
             {{32, 128, 784}}, {{16, 48, 80}}, {{32, 1024, 1024}}, {{16, 16, 16}}}) {
      INFO(m << " x " << n << " x " << k);
      const auto x = sg::test::representable<__half>(sg::test::uniform(std::size_t(m * k), rng));
      const auto w = sg::test::representable<__half>(sg::test::uniform(std::size_t(n * k), rng));
      const auto b = sg::test::representable<__half>(sg::test::uniform(std::size_t(n), rng));
      const std::vector<double> z = reference_linear(x, w, b, m, n, k, false);
      const std::vector<double> y = sg::test::activation_forward(act, z);
      // The pre-activation goes out only where a backward reads it (never with ReLU).
      const bool write_z = act != cuda::Activation::relu;
      DeviceArray<__half> dx(x), dw(w), db(b), dy(std::size_t(m * n)), dz(std::size_t(m * n));  // outputs poisoned
      cuda::SmallBatchLinear args = linear_args(dx.get(), dw.get(), db.get(), dy.get(), m, n, k, false);
      args.activation = act;
      if (write_z) args.pre_activation = dz.get();
      cuda::launch_small_batch_linear(args, nullptr, true);
      CHECK(sg::test::relative_error(dy.download(), y) < 2e-3);
      if (write_z) CHECK(sg::test::relative_error(dz.download(), z) < 2e-3);
      // Without the pre-activation (the eval graph's case) the output has the same bits.
      DeviceArray<__half> dy2(std::size_t(m * n));
      args.y = dy2.get();
      args.pre_activation = nullptr;
      cuda::launch_small_batch_linear(args, nullptr, true);
      CHECK(dy2.download() == dy.download());
    }
  }
  // A ReLU epilogue writes no pre-activation (nothing reads it: the mask is the output's sign).
  DeviceArray<__half> x(std::size_t(32 * 16)), w(std::size_t(16 * 16)), b(std::size_t(16)), y(std::size_t(32 * 16));
  cuda::SmallBatchLinear args = linear_args(x.get(), w.get(), b.get(), y.get(), 32, 16, 16, true);
  args.pre_activation = y.get();
  CHECK_THROWS_AS(cuda::launch_small_batch_linear(args, nullptr, true), cuda::CudaError);
}

TEST_CASE("small-batch forward with the batch fetch folded in gathers, scales and writes out X and the labels") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  const std::int64_t batch = 32, n = 64, k = 784, rows = 100, step = 5;  // 3 batches per epoch: batch 5 % 3 = 2
  const float scale = 1.f / 255.f / 0.3081f, shift = -0.1307f / 0.3081f;
  std::vector<float> images(static_cast<std::size_t>(rows * k)), labels(static_cast<std::size_t>(rows)),
      perm(static_cast<std::size_t>(rows));
  std::uniform_int_distribution<int> pixel(0, 255), label(0, 9);
  for (auto& v : images) v = float(pixel(rng));
  for (auto& v : labels) v = float(label(rng));
  for (std::size_t i = 0; i < perm.size(); ++i) perm[i] = float((i * 37 + 11) % rows);  // a permutation (37 coprime)
  const auto w = sg::test::representable<__half>(sg::test::uniform(std::size_t(n * k), rng));
  const auto b = sg::test::representable<__half>(sg::test::uniform(std::size_t(n), rng));
  DeviceArray<std::uint8_t> dimages(images), dlabels(labels);
  DeviceArray<std::int32_t> dperm(perm), dstep(std::vector<float>{float(step)}), labels_out(static_cast<std::size_t>(batch));
  DeviceArray<__half> dw(w), db(b), y(std::size_t(batch * n)), x_out(std::size_t(batch * k));
  cuda::SmallBatchLinear args = linear_args(nullptr, dw.get(), db.get(), y.get(), batch, n, k, true);
  args.fetch.perm = dperm.get();
  args.fetch.rows = rows;
  args.fetch.step = dstep.get();
  args.fetch.images = dimages.get();
  args.fetch.scale = scale;
  args.fetch.shift = shift;
  args.fetch.labels = dlabels.get();
  args.fetch.x_out = x_out.get();
  args.fetch.labels_out = labels_out.get();
  cuda::launch_small_batch_linear(args, nullptr, true);

  // X and the labels as the batch_fetch kernel writes them, bit for bit
  DeviceArray<__half> fetched(std::size_t(batch * k));
  DeviceArray<std::int32_t> fetched_labels(static_cast<std::size_t>(batch));
  cuda::launch_batch_fetch(dperm.get(), rows, dstep.get(), batch, dimages.get(), k, scale, shift, fetched.get(),
                           dlabels.get(), fetched_labels.get(), nullptr);
  const std::vector<float> x = fetched.download();
  CHECK(x_out.download() == x);
  const std::vector<float> got_labels = labels_out.download();
  CHECK(got_labels == fetched_labels.download());
  for (std::int64_t r = 0; r < batch; ++r) {  // and those are the permutation's rows for this step
    const auto row = std::size_t(perm[std::size_t((step % (rows / batch)) * batch + r)]);
    CHECK(got_labels[std::size_t(r)] == labels[row]);
    CHECK(x[std::size_t(r * k + 400)] == doctest::Approx(images[row * std::size_t(k) + 400] * scale + shift).epsilon(1e-3));
  }
  CHECK(sg::test::relative_error(y.download(), reference_linear(x, w, b, batch, n, k, true)) < 2e-3);
}

TEST_CASE("small-batch forward waits for the kernel that writes x (dependent launch, stream and graph)") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  const std::int64_t m = 32, n = 256, k = 512;
  sg::test::check_waits_for_late_x(m, n, k, rng, [&](const __half* x, const __half* w, const __half* b, __half* y,
                                                     cudaStream_t stream) {
    cuda::launch_small_batch_linear(linear_args(x, w, b, y, m, n, k, true), stream, true);
  });
}
