// The classifier-layer kernels against the CPU reference: forward with a
// tiny N, fused-SGD weight gradient with a tiny M, dgrad with a tiny K and the
// ReLU mask; odd K (N for the dgrad) takes the scalar path.
#include <doctest/doctest.h>

#include <array>

#include "ops/cpu/reference_ops.hpp"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/map_kernels.hpp"
#include "ops/cuda/small_linear.hpp"
#include "tests/runtime/test_support.hpp"
#include "tests/support/activation_reference.hpp"
#include "tests/support/device_array.hpp"
#include "tests/support/late_linear_input.hpp"

using namespace sg;
using sg::test::DeviceArray;

TEST_CASE("linear with a tiny N matches x W^T + b") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  for (auto [m, n, k] : std::vector<std::array<std::int64_t, 3>>{{{32, 10, 128}}, {{37, 11, 129}}, {{64, 32, 2048}}, {{1, 1, 1}}, {{1024, 10, 4096}}, {{300, 17, 136}}}) {
    INFO(m << "x" << n << "x" << k);
    const auto x = sg::test::representable<__half>(sg::test::uniform(std::size_t(m * k), rng));
    const auto w = sg::test::representable<__half>(sg::test::uniform(std::size_t(n * k), rng));
    const auto b = sg::test::representable<__half>(sg::test::uniform(std::size_t(n), rng));
    DeviceArray<__half> dx(x), dw(w), db(b), y(std::size_t(m * n));  // y starts poisoned (NaN)
    cuda::launch_linear_small_n(dx.get(), dw.get(), db.get(), m, n, k, y.get(), nullptr, true, true);
    std::vector<double> xd(x.begin(), x.end()), wd(w.begin(), w.end()), bd(b.begin(), b.end()), ref(std::size_t(m * n));
    ref::matmul(xd.data(), wd.data(), ref.data(), m, n, k, false, true);
    ref::bias_add(ref.data(), bd.data(), m, n, ref.data());
    CHECK(sg::test::relative_error(y.download(), ref) < 2e-3);
  }
}

TEST_CASE("linear with a tiny N for many rows: tensor-core tiles with K split over a cluster match x W^T + b") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  // K split over 8 blocks (8192, 1040: the last block's slice shorter), over
  // 1 (160); rows not a multiple of 16; N of 1, 9, 16; one round of steps in
  // flight only partly inside the slice (1040 = 65 steps). With classifier_mma off
  // (BackendOptions), the same sizes take a warp per output.
  for (const bool mma : {true, false})
  for (auto [m, n, k] : std::vector<std::array<std::int64_t, 3>>{
           {{256, 10, 8192}}, {{100, 16, 160}}, {{257, 9, 1040}}, {{64, 1, 16}}, {{1024, 10, 2048}}}) {
    INFO(m << "x" << n << "x" << k << (mma ? ", tensor cores" : ", a warp per output"));
    const bool tensor_cores = cuda::linear_small_n_on_tensor_cores(m, n, k);
    if (cuda::current_device_attribute(cudaDevAttrComputeCapabilityMajor) >= 9)
      CHECK(tensor_cores);  // the path under test (when mma is on)
    const auto x = sg::test::representable<__half>(sg::test::uniform(std::size_t(m * k), rng));
    const auto w = sg::test::representable<__half>(sg::test::uniform(std::size_t(n * k), rng));
    const auto b = sg::test::representable<__half>(sg::test::uniform(std::size_t(n), rng));
    DeviceArray<__half> dx(x), dw(w), db(b), y(std::size_t(m * n));  // y starts poisoned (NaN)
    cuda::launch_linear_small_n(dx.get(), dw.get(), db.get(), m, n, k, y.get(), nullptr, true, mma);
    const auto first = y.download();
    std::vector<double> xd(x.begin(), x.end()), wd(w.begin(), w.end()), bd(b.begin(), b.end()), ref(std::size_t(m * n));
    ref::matmul(xd.data(), wd.data(), ref.data(), m, n, k, false, true);
    ref::bias_add(ref.data(), bd.data(), m, n, ref.data());
    CHECK(sg::test::relative_error(first, ref) < 2e-3);
    // The blocks' partial sums are added in rank order: a second run gives the same bits.
    cuda::launch_linear_small_n(dx.get(), dw.get(), db.get(), m, n, k, y.get(), nullptr, true, mma);
    CHECK(y.download() == first);
  }
  CHECK_FALSE(cuda::linear_small_n_on_tensor_cores(32, 10, 8192));  // batch 32 keeps a warp per output
  CHECK_FALSE(cuda::linear_small_n_on_tensor_cores(256, 17, 8192));  // more than two 8-wide tiles
  CHECK_FALSE(cuda::linear_small_n_on_tensor_cores(256, 10, 8200));  // K not in 16-wide steps
}

// An activation producing x, applied as the kernels load it: the logits and
// the activation's output written there are the bits of the element-wise
// kernel's launch followed by the plain forward; both paths (tensor-core
// tiles, a warp per output), odd sizes, every activation.
TEST_CASE("linear with a tiny N applies the activation of its input on the load, with the element-wise kernel's bits") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  for (const cuda::Activation a : sg::test::kActivations)
    for (const bool mma : {true, false})
      for (auto [m, n, k] : std::vector<std::array<std::int64_t, 3>>{
               {{128, 10, 2048}}, {{37, 11, 129}}, {{257, 9, 1040}}, {{64, 16, 16}}, {{1, 1, 8}}}) {
        INFO(cuda::activation_op_name(a) << " " << m << "x" << n << "x" << k << (mma ? ", tensor cores" : ""));
        auto z = sg::test::uniform(std::size_t(m * k), rng);
        for (auto& v : z) v *= 4.f;  // past the activations' bends
        const auto x = sg::test::representable<__half>(z);
        const auto w = sg::test::representable<__half>(sg::test::uniform(std::size_t(n * k), rng));
        const auto b = sg::test::representable<__half>(sg::test::uniform(std::size_t(n), rng));
        DeviceArray<__half> dz(x), dw(w), db(b), separate(std::size_t(m * k)), want(std::size_t(m * n));
        DeviceArray<__half> activated(std::size_t(m * k)), y(std::size_t(m * n)), y_alone(std::size_t(m * n));
        const cuda::MapKernels* map = cuda::find_map_kernels(cuda::activation_op_name(a));
        REQUIRE(map);
        map->f16(dz.get(), nullptr, m * k, separate.get(), nullptr);
        cuda::launch_linear_small_n(separate.get(), dw.get(), db.get(), m, n, k, want.get(), nullptr, true, mma);
        cuda::launch_linear_small_n(dz.get(), dw.get(), db.get(), m, n, k, y.get(), nullptr, true, mma,
                                    {true, a, activated.get()});
        cuda::launch_linear_small_n(dz.get(), dw.get(), db.get(), m, n, k, y_alone.get(), nullptr, true, mma,
                                    {true, a, nullptr});  // the activation's output read by nobody else
        const auto want_y = want.download();
        // (fp16 values widened to float: equal floats are equal bits; an unwritten NaN is never equal)
        CHECK(y.download() == want_y);
        CHECK(y_alone.download() == want_y);
        CHECK(activated.download() == separate.download());
        // Those activations near the CPU reference's (fp16 rounding), the
        // logits the CPU reference's product of them.
        const auto act_h = separate.download();
        std::vector<double> xd(x.begin(), x.end()), wd(w.begin(), w.end()), bd(b.begin(), b.end());
        std::vector<double> act(act_h.begin(), act_h.end()), ref(std::size_t(m * n));
        CHECK(sg::test::relative_error(act_h, sg::test::activation_forward(a, xd)) < 2e-3);
        ref::matmul(act.data(), wd.data(), ref.data(), m, n, k, false, true);
        ref::bias_add(ref.data(), bd.data(), m, n, ref.data());
        CHECK(sg::test::relative_error(want_y, ref) < 2e-3);
      }
}

TEST_CASE("linear with a tiny N waits for the kernel that writes x (dependent launch, stream and graph)") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  const std::int64_t n = 10, k = 1024;
  for (const std::int64_t m : {32, 256}) {  // a warp per output; tensor-core tiles in clusters
    INFO("rows " << m);
    sg::test::check_waits_for_late_x(m, n, k, rng, [&](const __half* x, const __half* w, const __half* b, __half* y,
                                                       cudaStream_t stream) {
      cuda::launch_linear_small_n(x, w, b, m, n, k, y, stream, true, true);
    });
  }
}

TEST_CASE_TEMPLATE("fused-SGD weight gradient with a tiny M matches w*(1-lr*wd) - lr*dy^T x", W, __half, float) {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  const float lr = 0.1f, wd = 0.01f;
  const cuda::DeviceBuffer scalars = sg::test::device_update_scalars({cuda::make_update_scalars(lr, 0.f, wd)});
  for (auto [batch, m, k] : std::vector<std::array<std::int64_t, 3>>{{{32, 10, 128}}, {{33, 11, 129}}, {{64, 32, 784}}, {{1024, 10, 1000}}, {{257, 17, 64}}}) {
    INFO(batch << " " << m << " " << k);
    const auto dy = sg::test::representable<__half>(sg::test::uniform(std::size_t(batch * m), rng));
    const auto x = sg::test::representable<__half>(sg::test::uniform(std::size_t(batch * k), rng));
    const auto w = sg::test::representable<W>(sg::test::uniform(std::size_t(m * k), rng));
    DeviceArray<__half> ddy(dy), dx(x);
    DeviceArray<W> dw(w);
    cuda::launch_wgrad_sgd_small_m(ddy.get(), dx.get(), batch, m, k, dw.get(), scalars.as<cuda::UpdateScalars>(), nullptr,
                                   true);
    std::vector<double> dyd(dy.begin(), dy.end()), xd(x.begin(), x.end()), g(std::size_t(m * k)), ref(g.size());
    ref::matmul(dyd.data(), xd.data(), g.data(), m, k, batch, true, false);
    for (std::size_t i = 0; i < ref.size(); ++i) ref[i] = w[i] * (1.0 - double(lr) * wd) - double(lr) * g[i];
    const auto got = dw.download();
    CHECK(sg::test::relative_error(got, ref) < (std::is_same_v<W, float> ? 1e-5 : 2e-3));
    // The update really happened: W moved away from its start by about lr*|g|.
    CHECK(sg::test::relative_error(got, std::vector<double>(w.begin(), w.end())) > 1e-3);
  }
}

TEST_CASE("dgrad with a tiny K through every activation matches act'(dy w) on the CPU") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  for (const cuda::Activation act : sg::test::kActivations) {
    INFO(cuda::activation_op_name(act));
    for (auto [m, n, k] : std::vector<std::array<std::int64_t, 3>>{{{32, 128, 10}}, {{16, 1024, 10}}, {{37, 129, 11}}, {{5, 1000, 32}}}) {
      INFO(m << "x" << n << "x" << k);
      const auto dy = sg::test::representable<__half>(sg::test::uniform(std::size_t(m * k), rng));
      const auto w = sg::test::representable<__half>(sg::test::uniform(std::size_t(k * n), rng));
      // z in [-3, 3]: both sides of every activation's bend
      auto z = sg::test::uniform(std::size_t(m * n), rng);
      for (auto& v : z) v *= 3.f;
      const auto in = sg::test::activation_inputs<__half>(act, z);
      DeviceArray<__half> ddy(dy), dw(w), dsaved(in.saved), dx(std::size_t(m * n));  // dx starts poisoned (NaN)
      cuda::launch_dgrad_activation_small_k(act, ddy.get(), dw.get(), dsaved.get(), m, n, k, dx.get(), nullptr, true);
      std::vector<double> dyd(dy.begin(), dy.end()), wd(w.begin(), w.end()), pre(std::size_t(m * n));
      ref::matmul(dyd.data(), wd.data(), pre.data(), m, n, k, false, false);
      const auto ref = sg::test::activation_backward(act, pre, std::vector<double>(in.saved.begin(), in.saved.end()));
      CHECK(sg::test::relative_error(dx.download(), ref) < 2e-3);
    }
  }
}

TEST_CASE("dgrad with a tiny K and the ReLU mask matches (dy w) * (relu_out > 0)") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  for (auto [m, n, k] : std::vector<std::array<std::int64_t, 3>>{{{32, 128, 10}}, {{1024, 4096, 10}}, {{37, 129, 11}}, {{5, 1000, 32}}, {{1, 1, 1}}}) {
    INFO(m << "x" << n << "x" << k);
    const auto dy = sg::test::representable<__half>(sg::test::uniform(std::size_t(m * k), rng));
    const auto w = sg::test::representable<__half>(sg::test::uniform(std::size_t(k * n), rng));
    auto relu_out = sg::test::representable<__half>(sg::test::uniform(std::size_t(m * n), rng));
    for (auto& v : relu_out) v = v < 0 ? 0.f : v;  // about half masked
    DeviceArray<__half> ddy(dy), dw(w), drelu(relu_out), dx(std::size_t(m * n));  // dx starts poisoned (NaN)
    cuda::launch_dgrad_relu_small_k(ddy.get(), dw.get(), drelu.get(), m, n, k, dx.get(), nullptr, true);
    std::vector<double> dyd(dy.begin(), dy.end()), wd(w.begin(), w.end()), hd(relu_out.begin(), relu_out.end());
    std::vector<double> pre(std::size_t(m * n)), ref(pre.size());
    ref::matmul(dyd.data(), wd.data(), pre.data(), m, n, k, false, false);
    ref::relu_backward(pre.data(), hd.data(), std::int64_t(pre.size()), ref.data());
    CHECK(sg::test::relative_error(dx.download(), ref) < 2e-3);
  }
}
