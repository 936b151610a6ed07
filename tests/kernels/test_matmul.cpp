// cuBLASLt matmuls (row-major semantics) against ref::matmul: every transpose
// combination, both accumulation types, each epilogue and the fused-SGD form.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "ops/cpu/reference_ops.hpp"
#include "ops/cuda/cublaslt_matmul.hpp"
#include "tests/runtime/test_support.hpp"
#include "tests/support/device_array.hpp"

using namespace sg;
using sg::test::DeviceArray;

namespace {

struct Scalars {
  explicit Scalars(float alpha, float beta, bool half) : buf(16) {
    if (half) {
      const __half v[2] = {__float2half(alpha), __float2half(beta)};
      buf.upload(v, sizeof v);
    } else {
      const float v[2] = {alpha, beta};
      buf.upload(v, sizeof v);
    }
    alpha_ptr = buf.data();
    beta_ptr = buf.as<char>() + (half ? 2 : 4);
  }
  cuda::DeviceBuffer buf;
  const void* alpha_ptr;
  const void* beta_ptr;
};

struct Operands {
  std::vector<float> a, b;
};

Operands random_operands(const cuda::MatmulShape& s, std::mt19937_64& rng) {
  return {sg::test::representable<__half>(sg::test::uniform(static_cast<std::size_t>(s.m * s.k), rng)),
          sg::test::representable<__half>(sg::test::uniform(static_cast<std::size_t>(s.k * s.n), rng))};
}

std::vector<double> reference(const cuda::MatmulShape& s, const Operands& o) {
  std::vector<double> a(o.a.begin(), o.a.end()), b(o.b.begin(), o.b.end()), c(static_cast<std::size_t>(s.m * s.n));
  ref::matmul(a.data(), b.data(), c.data(), s.m, s.n, s.k, s.trans_a, s.trans_b);
  return c;
}

}  // namespace

TEST_CASE("plain matmul: all transposes, fp16 and fp32 accumulation, odd shapes") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  cuda::LtHandle lt;
  for (auto [m, n, k] : std::vector<std::array<std::int64_t, 3>>{{{37, 129, 65}}, {{32, 128, 784}}, {{1, 1, 1}}, {{256, 10, 128}}, {{33, 1000, 8}}})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (auto acc : {cuda::Accumulate::f16, cuda::Accumulate::f32}) {
          cuda::MatmulShape s{m, n, k, ta, tb, cuda::ElemType::f16, cuda::ElemType::f16, acc, cuda::Epilogue::none};
          INFO(s.describe());
          const auto ops = random_operands(s, rng);
          DeviceArray<__half> a(ops.a), b(ops.b), d(static_cast<std::size_t>(m * n));
          Scalars sc(1.f, 0.f, acc == cuda::Accumulate::f16);
          cuda::LtMatmul mm(lt, s, false, nullptr);
          mm.run(a.get(), b.get(), d.get(), d.get(), sc.alpha_ptr, sc.beta_ptr, nullptr, nullptr, nullptr);
          // fp16 accumulation over k terms: error grows like sqrt(k) ulps.
          CHECK(sg::test::relative_error(d.download(), reference(s, ops)) < (acc == cuda::Accumulate::f16 ? 2e-2 : 5e-3));
        }
}

TEST_CASE("linear forward with RELU_AUX_BIAS, then DRELU reading its mask (heuristic and autotuned algorithms)") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  cuda::LtHandle lt;
  // Autotuning times candidates with scratch bias/aux pointers: the runs after it must use ours.
  for (auto [batch, in, out] : std::vector<std::array<std::int64_t, 3>>{{{32, 784, 128}}, {{37, 65, 129}}, {{256, 128, 10}}})
  for (bool autotune : {false, true}) {
    INFO(batch << " " << in << " " << out << " autotune " << autotune);
    // z = x W^T + b, h = relu(z)
    cuda::MatmulShape fwd{batch, out, in, false, true, cuda::ElemType::f16, cuda::ElemType::f16, cuda::Accumulate::f32,
                          cuda::Epilogue::relu_aux_bias};
    const auto x = sg::test::representable<__half>(sg::test::uniform(static_cast<std::size_t>(batch * in), rng));
    const auto w = sg::test::representable<__half>(sg::test::uniform(static_cast<std::size_t>(out * in), rng, -0.2f, 0.2f));
    const auto bias = sg::test::representable<__half>(sg::test::uniform(static_cast<std::size_t>(out), rng));
    DeviceArray<__half> dx(x), dw(w), db(bias), h(static_cast<std::size_t>(batch * out));
    cuda::DeviceBuffer aux(cuda::relu_aux_bytes(batch, out));
    Scalars sc(1.f, 0.f, false);
    cuda::LtMatmul forward(lt, fwd, autotune, nullptr, /*autotune_min_macs=*/0);  // search even these small shapes
    forward.run(dx.get(), dw.get(), h.get(), h.get(), sc.alpha_ptr, sc.beta_ptr, db.get(), aux.data(), nullptr);
    std::vector<double> xd(x.begin(), x.end()), wd(w.begin(), w.end()), bd(bias.begin(), bias.end());
    std::vector<double> z(static_cast<std::size_t>(batch * out)), href(z.size());
    ref::matmul(xd.data(), wd.data(), z.data(), batch, out, in, false, true);
    ref::bias_add(z.data(), bd.data(), batch, out, z.data());
    ref::relu(z.data(), std::int64_t(z.size()), href.data());
    const auto hgot = h.download();
    CHECK(sg::test::relative_error(hgot, href) < 5e-3);

    // dh = dz2 W2 masked by relu'(z): the mask comes from the aux buffer.
    const std::int64_t next = 17;
    cuda::MatmulShape bwd{batch, out, next, false, false, cuda::ElemType::f16, cuda::ElemType::f16, cuda::Accumulate::f32,
                          cuda::Epilogue::drelu};
    const auto dz2 = sg::test::representable<__half>(sg::test::uniform(static_cast<std::size_t>(batch * next), rng));
    const auto w2 = sg::test::representable<__half>(sg::test::uniform(static_cast<std::size_t>(next * out), rng));
    DeviceArray<__half> ddz2(dz2), dw2(w2), dz(static_cast<std::size_t>(batch * out));
    cuda::LtMatmul backward(lt, bwd, autotune, nullptr, /*autotune_min_macs=*/0);
    backward.run(ddz2.get(), dw2.get(), dz.get(), dz.get(), sc.alpha_ptr, sc.beta_ptr, nullptr, aux.data(), nullptr);
    std::vector<double> dz2d(dz2.begin(), dz2.end()), w2d(w2.begin(), w2.end()), dh(static_cast<std::size_t>(batch * out)), dzref(dh.size());
    ref::matmul(dz2d.data(), w2d.data(), dh.data(), batch, out, next, false, false);
    // relu'(z) with z from the exact forward. Where |z| is below fp16
    // resolution the GPU's mask (from fp32 z) and its fp16 h may disagree on
    // the sign: such ties are excluded from the comparison on both sides.
    auto dzgot = dz.download();
    std::size_t ties = 0;
    for (std::size_t i = 0; i < z.size(); ++i) {
      dzref[i] = z[i] > 0 ? dh[i] : 0.0;
      if (std::abs(z[i]) < 1e-2) {
        dzref[i] = 0;
        dzgot[i] = 0.f;
        ++ties;
      }
    }
    CHECK(ties < z.size() / 20);
    const double err = sg::test::relative_error(dzgot, dzref);
    if (err >= 5e-3)  // say where: mask bits, rows or columns
      for (std::size_t i = 0, shown = 0; i < dzgot.size() && shown < 8; ++i)
        if (std::abs(double(dzgot[i]) - dzref[i]) > 1e-2 * (1 + std::abs(dzref[i]))) {
          MESSAGE("row " << i / out << " col " << i % out << " got " << float(dzgot[i]) << " want " << dzref[i]
                         << " z " << z[i] << " dh " << dh[i]);
          ++shown;
        }
    CHECK(err < 5e-3);
  }
}

TEST_CASE("fused SGD: the weight-gradient matmul updates W in place (f16 and f32 W)") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  cuda::LtHandle lt;
  const std::int64_t batch = 32, in = 129, out = 37;
  const float lr = 0.1f, wd = 0.01f;
  // dW = dz^T x : [out, in] from dz [batch, out] and x [batch, in]
  const auto dz = sg::test::representable<__half>(sg::test::uniform(static_cast<std::size_t>(batch * out), rng));
  const auto x = sg::test::representable<__half>(sg::test::uniform(static_cast<std::size_t>(batch * in), rng));
  const auto w0 = sg::test::representable<__half>(sg::test::uniform(static_cast<std::size_t>(out * in), rng));
  std::vector<double> dzd(dz.begin(), dz.end()), xd(x.begin(), x.end()), g(static_cast<std::size_t>(out * in));
  ref::matmul(dzd.data(), xd.data(), g.data(), out, in, batch, true, false);
  std::vector<double> wref(w0.begin(), w0.end());
  ref::sgd_update(wref.data(), g.data(), static_cast<double*>(nullptr), out * in, double(lr), 0.0, double(wd));

  DeviceArray<__half> ddz(dz), dx(x);
  const cuda::DeviceBuffer ds = sg::test::device_update_scalars({cuda::make_update_scalars(lr, 0.f, wd)});
  const auto* s = ds.as<cuda::UpdateScalars>();
  for (auto cd : {cuda::ElemType::f16, cuda::ElemType::f32}) {
    for (bool autotune : {false, true}) {
      INFO("W " << (cd == cuda::ElemType::f16 ? "f16" : "f32") << " autotune " << autotune);
      cuda::MatmulShape shape{out, in, batch, true, false, cuda::ElemType::f16, cd, cuda::Accumulate::f32,
                              cuda::Epilogue::none, /*reads_c=*/true};
      cuda::LtMatmul mm(lt, shape, autotune, nullptr, /*autotune_min_macs=*/0);
      std::vector<float> got;
      if (cd == cuda::ElemType::f16) {
        DeviceArray<__half> w(w0);
        mm.run(ddz.get(), dx.get(), w.get(), w.get(), &s->neg_lr, &s->one_minus_lr_wd, nullptr, nullptr, nullptr);
        got = w.download();
      } else {
        DeviceArray<float> w(w0);
        mm.run(ddz.get(), dx.get(), w.get(), w.get(), &s->neg_lr, &s->one_minus_lr_wd, nullptr, nullptr, nullptr);
        got = w.download();
      }
      CHECK(sg::test::relative_error(got, wref) < (cd == cuda::ElemType::f16 ? 2e-3 : 1e-5));
    }
  }
  CHECK_THROWS_AS(cuda::LtMatmul(lt, {out, in, batch, true, false, cuda::ElemType::f16, cuda::ElemType::f32,
                                      cuda::Accumulate::f16, cuda::Epilogue::none}, false, nullptr),
                  cuda::CudaError);
}

// A long reduction into few outputs (a CNN's linear layer after its flatten):
// autotune also times the heuristic's algorithms split 2-16 ways. Whichever it
// keeps must be the product, rerun to the same bits (the partials reduced in
// a fixed order), into a poisoned output.
TEST_CASE("long reductions autotuned with split-K candidates match the CPU reference and rerun bit for bit") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  cuda::LtHandle lt;
  for (auto [batch, in, out] : std::vector<std::array<std::int64_t, 3>>{{{128, 3136, 128}}, {{64, 2305, 37}}})
    for (const cuda::Epilogue epilogue : {cuda::Epilogue::none, cuda::Epilogue::relu_bias}) {
      cuda::MatmulShape s{batch, out, in, false, true, cuda::ElemType::f16, cuda::ElemType::f16, cuda::Accumulate::f32,
                          epilogue};
      INFO(s.describe());
      REQUIRE(cuda::long_reduction(s));
      const auto x = sg::test::representable<__half>(sg::test::uniform(static_cast<std::size_t>(batch * in), rng));
      const auto w = sg::test::representable<__half>(sg::test::uniform(static_cast<std::size_t>(out * in), rng));
      const auto bias = sg::test::representable<__half>(sg::test::uniform(static_cast<std::size_t>(out), rng));
      DeviceArray<__half> dx(x), dw(w), db(bias), y(static_cast<std::size_t>(batch * out)),
          again(static_cast<std::size_t>(batch * out));
      Scalars sc(1.f, 0.f, false);
      cuda::LtMatmul mm(lt, s, /*autotune=*/true, nullptr);  // the default size floor: split-K shapes are timed anyway
      MESSAGE(mm.label());
      CHECK(mm.label().rfind("cuBLASLt algorithm ", 0) == 0);
      CHECK(mm.label().find("split-K among them") != std::string::npos);
      mm.run(dx.get(), dw.get(), y.get(), y.get(), sc.alpha_ptr, sc.beta_ptr, db.get(), nullptr, nullptr);
      mm.run(dx.get(), dw.get(), again.get(), again.get(), sc.alpha_ptr, sc.beta_ptr, db.get(), nullptr, nullptr);
      std::vector<double> xd(x.begin(), x.end()), wd(w.begin(), w.end()), bd(bias.begin(), bias.end());
      std::vector<double> want(static_cast<std::size_t>(batch * out));
      ref::matmul(xd.data(), wd.data(), want.data(), batch, out, in, false, true);
      if (epilogue == cuda::Epilogue::relu_bias) {
        ref::bias_add(want.data(), bd.data(), batch, out, want.data());
        ref::relu(want.data(), std::int64_t(want.size()), want.data());
      }
      const auto got = y.download();
      CHECK(sg::test::relative_error(got, want) < 5e-3);
      const auto got_again = again.download();
      CHECK(std::equal(got.begin(), got.end(), got_again.begin(),
                       [](float p, float q) { return std::memcmp(&p, &q, sizeof p) == 0; }));
    }
}
