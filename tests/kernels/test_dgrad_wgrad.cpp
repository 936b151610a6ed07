// The one-pass dgrad + SGD kernel against the CPU reference: the previous
// layer's gradient (masked by the ReLU output) and the updated weights.
#include <doctest/doctest.h>

#include <array>

#include "ops/cpu/reference_ops.hpp"
#include "ops/cuda/fast_paths/one_pass_backward/dgrad_wgrad.hpp"
#include "ops/cuda/fast_paths/one_pass_backward/dgrad_wgrad_kernels.hpp"
#include "tests/runtime/test_support.hpp"
#include "tests/support/activation_reference.hpp"
#include "tests/support/late_producer.hpp"
#include "tests/support/device_array.hpp"
#include "tests/support/case_skips.hpp"

using namespace sg;
using sg::test::DeviceArray;

namespace {

// The CPU reference of one pass: dX = (dY W) * (X > 0) and W' = (1 - lr*wd) W - lr dY^T X.
struct OnePassReference {
  std::vector<double> dx, w;
};
template <typename T>
OnePassReference one_pass_reference(const std::vector<T>& dy, const std::vector<T>& x, const std::vector<T>& w,
                                    std::int64_t batch, std::int64_t n, std::int64_t k, double lr, double wd) {
  std::vector<double> dyd(dy.begin(), dy.end()), xd(x.begin(), x.end()), w0(w.begin(), w.end());
  std::vector<double> dh(std::size_t(batch * k)), g(std::size_t(n * k));
  OnePassReference r{std::vector<double>(dh.size()), std::vector<double>(g.size())};
  ref::matmul(dyd.data(), w0.data(), dh.data(), batch, k, n, false, false);
  ref::relu_backward(dh.data(), xd.data(), std::int64_t(dh.size()), r.dx.data());
  ref::matmul(dyd.data(), xd.data(), g.data(), n, k, batch, true, false);
  for (std::size_t i = 0; i < g.size(); ++i) r.w[i] = w0[i] * (1.0 - lr * wd) - lr * g[i];
  return r;
}

// The previous layer's bias after plain SGD at rate `lr` on the column sums
// of dx [batch, k]: the rounded dX the kernel wrote, which its sums read.
template <typename B, typename D>
std::vector<double> bias_reference(const std::vector<B>& b, const std::vector<D>& dx, std::int64_t batch, std::int64_t k,
                                   double lr) {
  std::vector<double> out(static_cast<std::size_t>(k));
  for (std::int64_t c = 0; c < k; ++c) {
    double g = 0;
    for (std::int64_t r = 0; r < batch; ++r) g += dx[std::size_t(r * k + c)];
    out[std::size_t(c)] = b[std::size_t(c)] - lr * g;
  }
  return out;
}

}  // namespace

TEST_CASE("one pass over W gives dX = (dY W) * (X > 0) and W' = (1 - lr*wd) W - lr dY^T X") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  const float lr = 0.05f, wd = 0.01f;
  const cuda::DeviceBuffer scalars = sg::test::device_update_scalars({cuda::make_update_scalars(lr, 0.f, wd)});
  // (batch, N rows of W, K columns, blocks per column strip; 0: the measured rule): column strips of
  // 16 and 32 (K < 8192), one block per strip or a cluster of 2, 4, 8 sharing it (rows not a
  // multiple of the cluster's warps included); row ranges (K >= 8192) with one or several ranges,
  // a strip wider than what is left of K, a short last range
  for (auto [batch, n, k, splits] : std::vector<std::array<std::int64_t, 4>>{{{32, 128, 128, 0}},
                                                                             {{16, 48, 80, 0}},
                                                                             {{32, 256, 4096, 0}},
                                                                             {{16, 16, 2048, 0}},
                                                                             {{32, 1024, 1024, 0}},
                                                                             {{32, 400, 512, 2}},
                                                                             {{32, 512, 512, 4}},
                                                                             {{16, 1024, 256, 8}},
                                                                             {{32, 64, 8192, 0}},
                                                                             {{32, 208, 8320, 0}},
                                                                             {{16, 16, 8192, 0}},
                                                                             {{32, 1024, 8192, 0}}}) {
    INFO(batch << " x " << n << " x " << k << ", blocks per strip " << splits);
    REQUIRE(cuda::dgrad_wgrad_unsupported(batch, n, k).empty());
    const auto dy = sg::test::representable<__half>(sg::test::uniform(std::size_t(batch * n), rng));
    auto x = sg::test::representable<__half>(sg::test::uniform(std::size_t(batch * k), rng));
    for (auto& v : x) v = v < 0 ? 0.f : v;  // a ReLU output: about half zeros
    const auto w = sg::test::representable<__half>(sg::test::uniform(std::size_t(n * k), rng));
    DeviceArray<__half> ddy(dy), dx_in(x), dw(w), dx(std::size_t(batch * k));  // dx starts poisoned
    const cuda::DgradWgradSgd kernel(batch, n, k, {int(splits)});
    if (splits > 0 && kernel.row_ranges() == 0) CHECK(kernel.strip_splits() == splits);
    kernel.launch(ddy.get(), dx_in.get(), dw.get(), dx.get(), scalars.as<cuda::UpdateScalars>(), nullptr);
    const OnePassReference expected = one_pass_reference(dy, x, w, batch, n, k, lr, wd);
    CHECK(sg::test::relative_error(dx.download(), expected.dx) < 5e-3);
    const auto w_new = dw.download();
    CHECK(sg::test::relative_error(w_new, expected.w) < 2e-3);
    CHECK(sg::test::relative_error(w_new, std::vector<double>(w.begin(), w.end())) > 1e-3);  // the update happened
  }
}

TEST_CASE("one pass over W through every activation: dX = act'(dY W) from X = act(Z) (or Z), W' and the bias update") {
  // (column strips and row ranges; the bias update runs in both)
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  const float lr = 0.05f, wd = 0.01f;
  const cuda::DeviceBuffer scalars =
      sg::test::device_update_scalars({cuda::make_update_scalars(lr, 0.f, wd), cuda::make_update_scalars(2 * lr, 0.f, 0.f)});
  const auto* s = scalars.as<cuda::UpdateScalars>();
  for (const cuda::Activation act : sg::test::kActivations) {
    INFO(cuda::activation_op_name(act));
    // (batch, N, K, blocks per strip): column strips of 16 and 32 columns, one block or a cluster
    // per strip; row ranges (K >= 8192), one range or several, a strip wider than what is left of K
    for (auto [batch, n, k, splits] : std::vector<std::array<std::int64_t, 4>>{
             {{32, 128, 128, 0}}, {{16, 48, 80, 0}}, {{32, 1024, 1024, 0}}, {{32, 512, 512, 4}}, {{32, 256, 4096, 0}},
             {{32, 64, 8192, 0}}, {{32, 208, 8320, 0}}, {{16, 16, 8192, 0}}}) {
      INFO(batch << " x " << n << " x " << k << ", blocks per strip " << splits);
      const auto dy = sg::test::representable<__half>(sg::test::uniform(std::size_t(batch * n), rng));
      auto z_values = sg::test::uniform(std::size_t(batch * k), rng);
      for (auto& v : z_values) v *= 3.f;
      const auto in = sg::test::activation_inputs<__half>(act, z_values);
      const auto w = sg::test::representable<__half>(sg::test::uniform(std::size_t(n * k), rng));
      const auto b = sg::test::representable<__half>(sg::test::uniform(std::size_t(k), rng));
      DeviceArray<__half> ddy(dy), dh(in.h), dz(in.z), dw(w), db(b), dx(std::size_t(batch * k));  // dx poisoned
      const cuda::DgradWgradSgd kernel(batch, n, k, {int(splits)}, 0, act);
      CHECK((kernel.row_ranges() > 0) == (k >= 8192));
      kernel.launch(ddy.get(), dh.get(), dw.get(), dx.get(), s, nullptr, db.get(), s + 1, {},
                    cuda::backward_reads_input(act) ? dz.get() : nullptr);
      std::vector<double> dyd(dy.begin(), dy.end()), hd(in.h.begin(), in.h.end()), w0(w.begin(), w.end());
      std::vector<double> pre(std::size_t(batch * k)), g(std::size_t(n * k)), w_ref(g.size());
      ref::matmul(dyd.data(), w0.data(), pre.data(), batch, k, n, false, false);
      const auto dx_ref =
          sg::test::activation_backward(act, pre, std::vector<double>(in.saved.begin(), in.saved.end()));
      ref::matmul(dyd.data(), hd.data(), g.data(), n, k, batch, true, false);
      for (std::size_t i = 0; i < g.size(); ++i) w_ref[i] = w0[i] * (1.0 - double(lr) * wd) - double(lr) * g[i];
      const auto dx_got = dx.download();
      CHECK(sg::test::relative_error(dx_got, dx_ref) < 5e-3);
      CHECK(sg::test::relative_error(dw.download(), w_ref) < 2e-3);
      CHECK(sg::test::relative_error(db.download(), bias_reference(b, dx_got, batch, k, 2.0 * lr)) < 2e-3);
    }
  }
  // The pre-activation is required where the backward reads it.
  DeviceArray<__half> dy(std::size_t(32 * 128)), x(std::size_t(32 * 128)), w(std::size_t(128 * 128)),
      dx(std::size_t(32 * 128));
  const cuda::DgradWgradSgd silu(32, 128, 128, {}, 0, cuda::Activation::silu);
  CHECK_THROWS_AS(silu.launch(dy.get(), x.get(), w.get(), dx.get(), s, nullptr), cuda::CudaError);
}

TEST_CASE("blocks per column strip: 2 for a 1024 x 1024 W on an H100, 1 where a warp would keep fewer than 4 chunks") {
  if (cuda::multiprocessor_count() != 132) {
    SG_SKIP_CASE("the rule's numbers are for a 132-SM H100");
  }
  CHECK(cuda::DgradWgradSgd(32, 1024, 1024).strip_splits() == 2);  // 64 strips, 64 chunks of rows
  CHECK(cuda::DgradWgradSgd(32, 512, 512).strip_splits() == 1);    // 32 strips, 32 chunks
  CHECK(cuda::DgradWgradSgd(32, 2048, 2048).strip_splits() == 1);  // 128 strips fill the SMs
  CHECK(cuda::DgradWgradSgd(32, 4096, 256).strip_splits() == 8);   // 16 strips, 256 chunks
}

TEST_CASE("the one-pass kernel also updates the previous layer's bias from the column sums of dX") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  // (K, blocks per strip): column strips (one block per strip; a cluster of 2 per strip), row ranges
  for (const auto [k, splits] : std::vector<std::array<std::int64_t, 2>>{{{4096, 0}}, {{1024, 2}}, {{8192, 0}}}) {
    const std::int64_t batch = 32, n = 256;
    INFO("K = " << k << ", blocks per strip " << splits);
    const float lr = 0.1f;
    const cuda::DeviceBuffer scalars =
        sg::test::device_update_scalars({cuda::make_update_scalars(lr, 0.f, 0.f), cuda::make_update_scalars(2 * lr, 0.f, 0.f)});
    const auto dy = sg::test::representable<__half>(sg::test::uniform(std::size_t(batch * n), rng));
    auto x = sg::test::representable<__half>(sg::test::uniform(std::size_t(batch * k), rng));
    for (auto& v : x) v = v < 0 ? 0.f : v;
    const auto w = sg::test::representable<__half>(sg::test::uniform(std::size_t(n * k), rng));
    const auto b = sg::test::representable<__half>(sg::test::uniform(std::size_t(k), rng));
    DeviceArray<__half> ddy(dy), dx_in(x), dw(w), db(b), dx(std::size_t(batch * k));
    const cuda::DgradWgradSgd kernel(batch, n, k, {int(splits)});
    const auto* s = scalars.as<cuda::UpdateScalars>();
    kernel.launch(ddy.get(), dx_in.get(), dw.get(), dx.get(), s, nullptr, db.get(), s + 1);
    CHECK(sg::test::relative_error(db.download(), bias_reference(b, dx.download(), batch, k, 2.0 * lr)) < 2e-3);
  }
}

TEST_CASE("a second launch sees the first one's weights and finishes its own dX (the arrival counters reset)") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  const std::int64_t batch = 32, n = 128, k = 8192;  // several row ranges per strip
  const float lr = 0.5f;
  const cuda::DeviceBuffer scalars = sg::test::device_update_scalars({cuda::make_update_scalars(lr, 0.f, 0.f)});
  const auto dy = sg::test::representable<__half>(sg::test::uniform(std::size_t(batch * n), rng));
  auto x = sg::test::representable<__half>(sg::test::uniform(std::size_t(batch * k), rng));
  for (auto& v : x) v = v < 0 ? 0.f : v;
  const auto w = sg::test::representable<__half>(sg::test::uniform(std::size_t(n * k), rng));
  DeviceArray<__half> ddy(dy), dx_in(x), dw(w), dx(std::size_t(batch * k));
  const cuda::DgradWgradSgd kernel(batch, n, k);
  REQUIRE(kernel.row_ranges() > 1);
  kernel.launch(ddy.get(), dx_in.get(), dw.get(), dx.get(), scalars.as<cuda::UpdateScalars>(), nullptr);
  const auto w_after_one = dw.download();
  dx.poison();
  kernel.launch(ddy.get(), dx_in.get(), dw.get(), dx.get(), scalars.as<cuda::UpdateScalars>(), nullptr);
  std::vector<double> dyd(dy.begin(), dy.end()), xd(x.begin(), x.end()), w1(w_after_one.begin(), w_after_one.end());
  std::vector<double> dh(std::size_t(batch * k)), dx_ref(dh.size());
  ref::matmul(dyd.data(), w1.data(), dh.data(), batch, k, n, false, false);
  ref::relu_backward(dh.data(), xd.data(), std::int64_t(dh.size()), dx_ref.data());
  CHECK(sg::test::relative_error(dx.download(), dx_ref) < 5e-3);
}

TEST_CASE("batch 256 (wgmma): dX, the SGD'd W and the previous layer's bias against the CPU reference") {
  if (const std::string why = cuda::one_pass::wgmma_unsupported(256, 128, 64); !why.empty()) {
    SG_SKIP_CASE(why);
  }
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  const std::int64_t batch = 256;
  const float lr = 0.05f, wd = 0.01f;
  const cuda::DeviceBuffer scalars = sg::test::device_update_scalars(
      {cuda::make_update_scalars(lr, 0.f, wd), cuda::make_update_scalars(2 * lr, 0.f, 0.f)});
  const auto* s = scalars.as<cuda::UpdateScalars>();
  // (N rows of W, K columns): one block and one pair of row tiles; several blocks; 10 and 32 row
  // tiles, so each of the 4 pipeline slots is reused (barrier phases flip); through DgradWgradSgd at
  // K = 8192 (128 blocks, the size the scheduler picks it for). 1 and 3 blocks each copy all of dY;
  // 2, 4 and 128 blocks run as pairs that share it (multicast), unless multicast is off (every size
  // once more, each block with its own copy).
  CHECK(cuda::one_pass::wgmma_blocks_sharing_dy(192, true) == 1);
  CHECK(cuda::one_pass::wgmma_blocks_sharing_dy(8192, true) == 2);
  CHECK(cuda::one_pass::wgmma_blocks_sharing_dy(8192, false) == 1);
  for (const bool multicast : {true, false})
  for (auto [n, k] : std::vector<std::array<std::int64_t, 2>>{{{128, 64}}, {{256, 192}}, {{640, 128}}, {{2048, 256}}, {{128, 8192}}}) {
    INFO(batch << " x " << n << " x " << k << ", blocks sharing dY "
               << cuda::one_pass::wgmma_blocks_sharing_dy(k, multicast));
    const auto dy = sg::test::representable<__half>(sg::test::uniform(std::size_t(batch * n), rng));
    auto x = sg::test::representable<__half>(sg::test::uniform(std::size_t(batch * k), rng));
    for (auto& v : x) v = v < 0 ? 0.f : v;  // a ReLU output: about half zeros
    const auto w = sg::test::representable<__half>(sg::test::uniform(std::size_t(n * k), rng));
    const auto b = sg::test::representable<__half>(sg::test::uniform(std::size_t(k), rng));
    DeviceArray<__half> ddy(dy), dx_in(x), dw(w), db(b), dx(std::size_t(batch * k));  // dx starts poisoned
    if (k >= 8192) {
      REQUIRE(cuda::dgrad_wgrad_unsupported(batch, n, k).empty());
      const cuda::DgradWgradSgd kernel(batch, n, k, {.multicast = multicast});
      REQUIRE(kernel.wgmma());
      kernel.launch(ddy.get(), dx_in.get(), dw.get(), dx.get(), s, nullptr, db.get(), s + 1);
    } else {
      cuda::one_pass::launch_wgmma(ddy.get(), dx_in.get(), n, k, dw.get(), dx.get(), s, nullptr, multicast, db.get(),
                                   s + 1);
    }
    const OnePassReference expected = one_pass_reference(dy, x, w, batch, n, k, lr, wd);
    const auto dx_got = dx.download();
    CHECK(sg::test::relative_error(dx_got, expected.dx) < 5e-3);
    const auto w_new = dw.download();
    CHECK(sg::test::relative_error(w_new, expected.w) < 2e-3);
    CHECK(sg::test::relative_error(w_new, std::vector<double>(w.begin(), w.end())) > 1e-3);  // the update happened
    CHECK(sg::test::relative_error(db.download(), bias_reference(b, dx_got, batch, k, 2.0 * lr)) < 2e-3);
  }
}

TEST_CASE("batch 256 (wgmma) through every activation: dX = act'(dY W) from X = act(Z) (or Z), W' and the bias") {
  if (const std::string why = cuda::one_pass::wgmma_unsupported(256, 128, 64); !why.empty()) {
    SG_SKIP_CASE(why);
  }
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  const std::int64_t batch = 256;
  const float lr = 0.05f, wd = 0.01f;
  const cuda::DeviceBuffer scalars = sg::test::device_update_scalars(
      {cuda::make_update_scalars(lr, 0.f, wd), cuda::make_update_scalars(2 * lr, 0.f, 0.f)});
  const auto* s = scalars.as<cuda::UpdateScalars>();
  for (const cuda::Activation act : sg::test::kActivations) {
    INFO(cuda::activation_op_name(act));
    // (N, K, multicast): N = 128 (the Z tile lands in a slot no row block used), 256 (slot 0 after
    // its one use), 640 and 1536 (slots 2 and 0 after several uses: barrier phases flip); one block,
    // 3 blocks each with its own dY, pairs sharing dY; K = 8192 through DgradWgradSgd (the size the
    // scheduler picks it for)
    for (auto [n, k, multicast] : std::vector<std::array<std::int64_t, 3>>{
             {{128, 64, 1}}, {{256, 192, 1}}, {{640, 128, 1}}, {{1536, 256, 0}}, {{128, 8192, 1}}}) {
      INFO(batch << " x " << n << " x " << k << ", multicast " << multicast);
      const auto dy = sg::test::representable<__half>(sg::test::uniform(std::size_t(batch * n), rng));
      auto z_values = sg::test::uniform(std::size_t(batch * k), rng);
      for (auto& v : z_values) v *= 3.f;
      const auto in = sg::test::activation_inputs<__half>(act, z_values);
      const auto w = sg::test::representable<__half>(sg::test::uniform(std::size_t(n * k), rng));
      const auto b = sg::test::representable<__half>(sg::test::uniform(std::size_t(k), rng));
      DeviceArray<__half> ddy(dy), dh(in.h), dz(in.z), dw(w), db(b), dx(std::size_t(batch * k));  // dx poisoned
      const __half* saved = cuda::backward_reads_input(act) ? dz.get() : nullptr;
      if (k >= 8192) {
        REQUIRE(cuda::dgrad_wgrad_unsupported(batch, n, k).empty());
        const cuda::DgradWgradSgd kernel(batch, n, k, {.multicast = multicast != 0}, 0, act);
        REQUIRE(kernel.wgmma());
        kernel.launch(ddy.get(), dh.get(), dw.get(), dx.get(), s, nullptr, db.get(), s + 1, {}, saved);
      } else {
        cuda::one_pass::launch_wgmma(ddy.get(), dh.get(), n, k, dw.get(), dx.get(), s, nullptr, multicast != 0,
                                     db.get(), s + 1, act, saved);
      }
      std::vector<double> dyd(dy.begin(), dy.end()), hd(in.h.begin(), in.h.end()), w0(w.begin(), w.end());
      std::vector<double> pre(std::size_t(batch * k)), g(std::size_t(n * k)), w_ref(g.size());
      ref::matmul(dyd.data(), w0.data(), pre.data(), batch, k, n, false, false);
      const auto dx_ref =
          sg::test::activation_backward(act, pre, std::vector<double>(in.saved.begin(), in.saved.end()));
      ref::matmul(dyd.data(), hd.data(), g.data(), n, k, batch, true, false);
      for (std::size_t i = 0; i < g.size(); ++i) w_ref[i] = w0[i] * (1.0 - double(lr) * wd) - double(lr) * g[i];
      const auto dx_got = dx.download();  // a NaN (the poison left in an unwritten element) fails these
      CHECK(sg::test::relative_error(dx_got, dx_ref) < 5e-3);
      const auto w_new = dw.download();
      CHECK(sg::test::relative_error(w_new, w_ref) < 2e-3);
      CHECK(sg::test::relative_error(w_new, w0) > 1e-3);  // the update happened
      CHECK(sg::test::relative_error(db.download(), bias_reference(b, dx_got, batch, k, 2.0 * lr)) < 2e-3);
    }
  }
  // The pre-activation is required where the backward reads it.
  DeviceArray<__half> dy(std::size_t(256 * 128)), x(std::size_t(256 * 64)), w(std::size_t(128 * 64)),
      dx(std::size_t(256 * 64));
  CHECK_THROWS_AS(cuda::one_pass::launch_wgmma(dy.get(), x.get(), 128, 64, w.get(), dx.get(), s, nullptr, true,
                                               nullptr, nullptr, cuda::Activation::gelu, nullptr),
                  cuda::CudaError);
}

TEST_CASE("sizes the one-pass kernel does not take are refused with a reason") {
  CHECK(cuda::dgrad_wgrad_unsupported(24, 64, 64).find("batch") != std::string::npos);
  CHECK(cuda::dgrad_wgrad_unsupported(256, 1024, 4096).find("K = 4096") != std::string::npos);  // cuBLASLt is faster
  CHECK(cuda::one_pass::wgmma_unsupported(256, 192, 64).find("multiple of 128") != std::string::npos);
  CHECK(cuda::one_pass::wgmma_unsupported(128, 256, 64).find("batch 128") != std::string::npos);
  CHECK(cuda::dgrad_wgrad_unsupported(32, 40, 64).find("multiple of 16") != std::string::npos);
  CHECK(cuda::dgrad_wgrad_unsupported(32, 64, 64).empty());
}

TEST_CASE("the one-pass kernel waits for the kernel that writes dY (dependent launch, stream and graph)") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  const cuda::DeviceBuffer scalars = sg::test::device_update_scalars({cuda::make_update_scalars(0.05f, 0.f, 0.f)});
  // (K, blocks per strip): column strips (one block per strip; a cluster of 2 per strip), row ranges
  for (const auto [k, splits] : std::vector<std::array<std::int64_t, 2>>{{{1024, 1}}, {{1024, 2}}, {{8192, 0}}}) {
    const std::int64_t batch = 32, n = 256;
    INFO("K = " << k << ", blocks per strip " << splits);
    const auto dy = sg::test::representable<__half>(sg::test::uniform(std::size_t(batch * n), rng));
    auto x = sg::test::representable<__half>(sg::test::uniform(std::size_t(batch * k), rng));
    for (auto& v : x) v = v < 0 ? 0.f : v;
    const auto w = sg::test::representable<__half>(sg::test::uniform(std::size_t(n * k), rng));
    const cuda::DgradWgradSgd kernel(batch, n, k, {int(splits)});
    DeviceArray<__half> ddy(dy), dx_in(x), w_expected(w), dx_expected(std::size_t(batch * k));
    kernel.launch(ddy.get(), dx_in.get(), w_expected.get(), dx_expected.get(), scalars.as<cuda::UpdateScalars>(), nullptr);
    for (const bool as_graph : {false, true}) {
      INFO((as_graph ? "graph" : "stream"));
      DeviceArray<__half> late_dy(dy.size()), dw(w), dx(std::size_t(batch * k));  // late_dy: poison until the copy
      sg::test::run_behind_late_copy(
          late_dy.get(), ddy.get(), dy.size() * sizeof(__half),
          [&](cudaStream_t stream) {
            kernel.launch(late_dy.get(), dx_in.get(), dw.get(), dx.get(), scalars.as<cuda::UpdateScalars>(), stream);
          },
          as_graph);
      CHECK(dx.download() == dx_expected.download());
      CHECK(dw.download() == w_expected.download());
    }
  }
}

TEST_CASE("the one-pass kernel also updates the first layer's weight from dX: W_in' = W_in - lr dX^T X_in") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  // (N, K, blocks per strip, input width): strips of 16 and of 32 (K = 4096), a cluster of 2 per
  // strip (only rank 0 holds the strip's dX), the MNIST input and a narrow one
  for (const auto [n, k, splits, width] : std::vector<std::array<std::int64_t, 4>>{
           {{128, 128, 0, 784}}, {{256, 4096, 0, 784}}, {{512, 256, 2, 784}}, {{64, 64, 0, 32}}}) {
    const std::int64_t batch = 32;
    INFO(n << " x " << k << ", blocks per strip " << splits << ", input width " << width);
    REQUIRE(cuda::input_update_unsupported(batch, n, k, width).empty());
    const float lr = 0.1f, wd = 0.01f;
    const cuda::DeviceBuffer scalars = sg::test::device_update_scalars(
        {cuda::make_update_scalars(lr, 0.f, 0.f), cuda::make_update_scalars(2 * lr, 0.f, 0.f),
         cuda::make_update_scalars(3 * lr, 0.f, wd)});
    const auto dy = sg::test::representable<__half>(sg::test::uniform(std::size_t(batch * n), rng));
    auto x = sg::test::representable<__half>(sg::test::uniform(std::size_t(batch * k), rng));
    for (auto& v : x) v = v < 0 ? 0.f : v;
    const auto w = sg::test::representable<__half>(sg::test::uniform(std::size_t(n * k), rng));
    const auto b = sg::test::representable<__half>(sg::test::uniform(std::size_t(k), rng));
    const auto x_in = sg::test::representable<__half>(sg::test::uniform(std::size_t(batch * width), rng));
    const auto w_in = sg::test::representable<__half>(sg::test::uniform(std::size_t(k * width), rng));
    DeviceArray<__half> ddy(dy), dx_in(x), dw(w), db(b), dx(std::size_t(batch * k)), dx_input(x_in), dw_in(w_in);
    const cuda::DgradWgradSgd kernel(batch, n, k, {int(splits)}, width);
    const auto* s = scalars.as<cuda::UpdateScalars>();
    const cuda::one_pass::InputLayerUpdate input{dx_input.get(), dw_in.get(), s + 2, int(width)};
    kernel.launch(ddy.get(), dx_in.get(), dw.get(), dx.get(), s, nullptr, db.get(), s + 1, input);
    const auto dx_got = dx.download();  // the rounded dX it wrote (checked against the CPU in the first test)
    std::vector<double> dxd(dx_got.begin(), dx_got.end()), xd(x_in.begin(), x_in.end()), g(std::size_t(k * width));
    ref::matmul(dxd.data(), xd.data(), g.data(), k, width, batch, true, false);
    std::vector<double> w_ref(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) w_ref[i] = w_in[i] * (1.0 - 3.0 * lr * wd) - 3.0 * lr * g[i];
    const auto w_in_new = dw_in.download();
    CHECK(sg::test::relative_error(w_in_new, w_ref) < 2e-3);
    CHECK(sg::test::relative_error(w_in_new, std::vector<double>(w_in.begin(), w_in.end())) > 1e-3);
    std::vector<double> b_ref(static_cast<std::size_t>(k));  // the bias update still happens beside it
    for (std::int64_t c = 0; c < k; ++c) {
      double sum = 0;
      for (std::int64_t r = 0; r < batch; ++r) sum += dx_got[std::size_t(r * k + c)];
      b_ref[std::size_t(c)] = b[std::size_t(c)] - 2.0 * lr * sum;
    }
    const auto b_new = db.download();
    CHECK(sg::test::relative_error(b_new, b_ref) < 2e-3);
    // Without dX in global memory (when only the folded update reads it): the same bits.
    DeviceArray<__half> w2(w), b2(b), w_in2(w_in);
    const cuda::one_pass::InputLayerUpdate input2{dx_input.get(), w_in2.get(), s + 2, int(width)};
    kernel.launch(ddy.get(), dx_in.get(), w2.get(), nullptr, s, nullptr, b2.get(), s + 1, input2);
    CHECK(w_in2.download() == w_in_new);
    CHECK(b2.download() == b_new);
    CHECK(w2.download() == dw.download());
  }
  CHECK(!cuda::input_update_unsupported(32, 64, 8192, 784).empty());  // the row-range kernel
  CHECK(!cuda::input_update_unsupported(32, 64, 64, 100).empty());
}
