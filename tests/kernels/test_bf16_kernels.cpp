// The bf16 instantiations of our generic kernels and cuBLASLt's CUDA_R_16BF
// matmuls against the CPU references, on random shapes, with poisoned
// outputs (NaN never passes: relative_error is infinite then).
//
// Tolerances: bf16 keeps 8 significant bits, so one rounding of a result is
// off by at most 2^-9 relative (half an ulp) and the norm-wise error of an
// output rounded once is below 2^-8 = 3.9e-3. Inputs are bf16-representable,
// so the CPU sees what the GPU sees; bounds allow two roundings (8e-3) where
// a kernel rounds an intermediate, and 1.5e-2 where f32 sums of up to 784
// terms meet cancellation (the matmul and the column sums).
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <numeric>

#include "ops/cpu/reference_ops.hpp"
#include "ops/cuda/cublaslt_matmul.hpp"
#include "ops/cuda/map_kernels.hpp"
#include "tests/runtime/test_support.hpp"
#include "tests/support/device_array.hpp"

using namespace sg;
using sg::test::DeviceArray;
using bf16 = __nv_bfloat16;

namespace {

constexpr double kOneRounding = 4e-3;
constexpr double kTwoRoundings = 8e-3;
constexpr double kLongSums = 1.5e-2;

std::vector<float> random_bf16(std::size_t n, std::mt19937_64& rng, float lo = -1.f, float hi = 1.f) {
  return sg::test::representable<bf16>(sg::test::uniform(n, rng, lo, hi));
}

// A random [rows, cols], odd sizes included.
std::pair<std::int64_t, std::int64_t> random_shape(std::mt19937_64& rng) {
  return {1 + std::int64_t(rng() % 300), 1 + std::int64_t(rng() % 700)};
}

}  // namespace

TEST_CASE("bf16 element-wise maps (through the map table), bias_add and casts match the CPU") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  for (int trial = 0; trial < 6; ++trial) {
    const auto [rows, cols] = random_shape(rng);
    INFO(rows << "x" << cols);
    const auto n = rows * cols;
    const auto a = random_bf16(static_cast<std::size_t>(n), rng, -4.f, 4.f);
    const auto b = random_bf16(static_cast<std::size_t>(n), rng);
    const auto bias = random_bf16(static_cast<std::size_t>(cols), rng);
    DeviceArray<bf16> da(a), db(b), dbias(bias), out(static_cast<std::size_t>(n));
    std::vector<float> ref(static_cast<std::size_t>(n));
    const auto run_map = [&](const char* op) {
      const cuda::MapKernels* k = cuda::find_map_kernels(op);
      REQUIRE(k);
      const bool has_bf16 = k->bf16 != nullptr;
      REQUIRE(has_bf16);  // every shipped map has a bf16 kernel
      out.poison();
      k->bf16(da.get(), k->arity == 2 ? db.get() : nullptr, n, out.get(), nullptr);
      return out.download();
    };
    // (a, b) order as the maps take them: relu_backward(dy, y), gelu_backward(dy, x)
    ref::relu(a.data(), n, ref.data());
    CHECK(sg::test::relative_error(run_map("relu"), ref) < kOneRounding);
    ref::relu_backward(a.data(), b.data(), n, ref.data());
    CHECK(sg::test::relative_error(run_map("relu_backward"), ref) < kOneRounding);
    ref::add(a.data(), b.data(), n, ref.data());
    CHECK(sg::test::relative_error(run_map("add"), ref) < kOneRounding);
    ref::gelu(a.data(), n, ref.data());
    CHECK(sg::test::relative_error(run_map("gelu"), ref) < kOneRounding);
    ref::gelu_backward(a.data(), b.data(), n, ref.data());
    CHECK(sg::test::relative_error(run_map("gelu_backward"), ref) < kOneRounding);
    // The activations added with issue 21 (helper C's kernels, instantiated for bf16 by the same table).
    using Unary = void (*)(const float*, std::int64_t, float*);
    using Binary = void (*)(const float*, const float*, std::int64_t, float*);
    for (const auto& [name, f] : std::vector<std::pair<const char*, Unary>>{
             {"gelu_tanh", ref::gelu_tanh<float>}, {"silu", ref::silu<float>}, {"tanh", ref::tanh<float>},
             {"sigmoid", ref::sigmoid<float>}}) {
      INFO(name);
      f(a.data(), n, ref.data());
      CHECK(sg::test::relative_error(run_map(name), ref) < kOneRounding);
    }
    for (const auto& [name, f] : std::vector<std::pair<const char*, Binary>>{
             {"gelu_tanh_backward", ref::gelu_tanh_backward<float>}, {"silu_backward", ref::silu_backward<float>},
             {"tanh_backward", ref::tanh_backward<float>}, {"sigmoid_backward", ref::sigmoid_backward<float>}}) {
      INFO(name);
      f(a.data(), b.data(), n, ref.data());
      CHECK(sg::test::relative_error(run_map(name), ref) < kOneRounding);
    }

    out.poison();
    cuda::launch_bias_add(da.get(), dbias.get(), rows, cols, out.get(), nullptr);
    ref::bias_add(a.data(), bias.data(), rows, cols, ref.data());
    CHECK(sg::test::relative_error(out.download(), ref) < kOneRounding);
  }
  // Casts round to nearest even, as the CPU backend's emulation does (bit-exact).
  const auto x = sg::test::uniform(1001, rng, -100.f, 100.f);
  DeviceArray<float> f(x);
  DeviceArray<bf16> h(x.size());
  cuda::launch_cast(f.get(), std::int64_t(x.size()), h.get(), nullptr);
  const auto rounded = h.download();
  CHECK(rounded == sg::test::representable<bf16>(x));
  DeviceArray<float> back(x.size());
  cuda::launch_cast(h.get(), std::int64_t(x.size()), back.get(), nullptr);
  CHECK(back.download() == rounded);
}

TEST_CASE("bf16 softmax cross-entropy: loss, gradient and argmax hits") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  for (auto [rows, cols] : std::vector<std::pair<std::int64_t, std::int64_t>>{{32, 10}, {37, 129}, {1, 2}, {1024, 10}, {4096, 33}}) {
    INFO(rows << "x" << cols);
    const auto logits = random_bf16(static_cast<std::size_t>(rows * cols), rng, -4.f, 4.f);
    std::vector<std::int32_t> labels(static_cast<std::size_t>(rows));
    for (auto& l : labels) l = std::int32_t(rng() % std::uint64_t(cols));
    DeviceArray<bf16> dl(logits), grad(logits.size());
    DeviceArray<float> loss(1);
    DeviceArray<std::int32_t> hits(1);
    cuda::DeviceBuffer dlabels(labels.size() * 4);
    dlabels.upload(labels.data(), labels.size() * 4);
    cuda::launch_softmax_xent(dl.get(), dlabels.as<std::int32_t>(), rows, cols, loss.get(), grad.get(), nullptr, true);
    std::vector<double> ld(logits.begin(), logits.end()), gref(logits.size());
    const double lref = ref::softmax_xent(ld.data(), labels.data(), rows, cols);
    ref::softmax_xent_backward(ld.data(), labels.data(), rows, cols, gref.data());
    CHECK(std::abs(loss.download()[0] - lref) / lref < 1e-4);  // the loss is summed and kept in f32
    // dlogits rounded once to bf16; the softmax - onehot cancellation of a
    // confident row adds __expf's few f32 ulps on top: two roundings' worth.
    CHECK(sg::test::relative_error(grad.download(), gref) < kTwoRoundings);
    hits.poison();
    cuda::launch_count_correct(dl.get(), dlabels.as<std::int32_t>(), rows, cols, hits.get(), nullptr);
    std::vector<float> lf(logits.begin(), logits.end());
    CHECK(hits.download()[0] == float(ref::count_correct(lf.data(), labels.data(), rows, cols)));
  }
}

TEST_CASE("bf16 column sums, the fused bias-gradient SGD (bf16 and fp32 biases), SGD and momentum finish") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  for (int trial = 0; trial < 5; ++trial) {
    const auto [rows, cols] = random_shape(rng);
    INFO(rows << "x" << cols);
    const auto dy = random_bf16(static_cast<std::size_t>(rows * cols), rng);
    DeviceArray<bf16> ddy(dy), sums(static_cast<std::size_t>(cols));
    cuda::launch_reduce_rows(ddy.get(), rows, cols, sums.get(), nullptr, true);
    std::vector<double> dyd(dy.begin(), dy.end()), sref(static_cast<std::size_t>(cols));
    ref::reduce_rows(dyd.data(), rows, cols, sref.data());
    CHECK(sg::test::relative_error(sums.download(), sref) < kLongSums);

    for (float momentum : {0.f, 0.9f}) {
      INFO("momentum " << momentum);
      const auto b0 = random_bf16(static_cast<std::size_t>(cols), rng);
      const auto v0 = random_bf16(static_cast<std::size_t>(cols), rng);
      const cuda::DeviceBuffer ds = sg::test::device_update_scalars({cuda::make_update_scalars(0.1f, momentum, 0.01f)});
      std::vector<double> b(b0.begin(), b0.end()), v(v0.begin(), v0.end());
      ref::sgd_update(b.data(), sref.data(), momentum > 0 ? v.data() : nullptr, cols, 0.1, double(momentum), 0.01);
      {  // bf16 bias: the update is rounded once into it
        DeviceArray<bf16> bias(b0), vel(v0);
        cuda::launch_bias_grad_sgd(ddy.get(), rows, cols, bias.get(), momentum > 0 ? vel.get() : nullptr,
                                   ds.as<cuda::UpdateScalars>(), nullptr, true);
        CHECK(sg::test::relative_error(bias.download(), b) < kTwoRoundings);
        if (momentum > 0) CHECK(sg::test::relative_error(vel.download(), v) < kLongSums);
      }
      {  // fp32 master bias with a bf16 gradient: no rounding of the result
        DeviceArray<float> bias(b0), vel(v0);
        cuda::launch_bias_grad_sgd(ddy.get(), rows, cols, bias.get(), momentum > 0 ? vel.get() : nullptr,
                                   ds.as<cuda::UpdateScalars>(), nullptr, true);
        CHECK(sg::test::relative_error(bias.download(), b) < 1e-3);
        if (momentum > 0) CHECK(sg::test::relative_error(vel.download(), v) < 1e-3);
      }
    }
  }
  // Element-wise SGD: bf16 weights, and fp32 master weights with a bf16 gradient.
  const std::int64_t n = 4099;
  const auto w0 = random_bf16(static_cast<std::size_t>(n), rng), g = random_bf16(static_cast<std::size_t>(n), rng),
             v0 = random_bf16(static_cast<std::size_t>(n), rng);
  const cuda::DeviceBuffer ds = sg::test::device_update_scalars({cuda::make_update_scalars(0.05f, 0.9f, 0.001f)});
  std::vector<double> w(w0.begin(), w0.end()), v(v0.begin(), v0.end()), gd(g.begin(), g.end());
  ref::sgd_update(w.data(), gd.data(), v.data(), n, 0.05, 0.9, 0.001);
  DeviceArray<bf16> bw(w0), bg(g), bv(v0);
  cuda::launch_sgd_update(bw.get(), static_cast<const bf16*>(bg.get()), bv.get(), n, ds.as<cuda::UpdateScalars>(), nullptr);
  CHECK(sg::test::relative_error(bw.download(), w) < kOneRounding);
  CHECK(sg::test::relative_error(bv.download(), v) < kOneRounding);
  DeviceArray<float> mw(w0), mv(v0);
  cuda::launch_sgd_update(mw.get(), static_cast<const bf16*>(bg.get()), mv.get(), n, ds.as<cuda::UpdateScalars>(), nullptr);
  CHECK(sg::test::relative_error(mw.download(), w) < 1e-6);
  CHECK(sg::test::relative_error(mv.download(), v) < 1e-6);
  // momentum_finish after a matmul wrote v = momentum*v + g (itself rounded to bf16).
  std::vector<float> vpre(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < vpre.size(); ++i) vpre[i] = 0.9f * v0[i] + g[i];
  vpre = sg::test::representable<bf16>(vpre);
  std::vector<double> wf(w0.begin(), w0.end()), vf(vpre.begin(), vpre.end());
  for (std::size_t i = 0; i < wf.size(); ++i) {
    vf[i] += 0.001 * wf[i];
    wf[i] -= 0.05 * vf[i];
  }
  DeviceArray<bf16> fw(w0), fv(vpre);
  cuda::launch_momentum_finish(fw.get(), fv.get(), n, ds.as<cuda::UpdateScalars>(), nullptr);
  CHECK(sg::test::relative_error(fw.download(), wf) < kOneRounding);
  CHECK(sg::test::relative_error(fv.download(), vf) < kOneRounding);
}

TEST_CASE("bf16 batch fetch gathers the step's rows (scaled, rounded) and labels") {
  auto rng = sg::test::fresh_rng();
  for (std::int64_t cols : {784, 37}) {
    const std::int64_t n = 203, batch = 32;
    std::vector<std::uint8_t> images(static_cast<std::size_t>(n * cols)), labels(static_cast<std::size_t>(n));
    for (auto& p : images) p = std::uint8_t(rng() % 256);
    for (auto& l : labels) l = std::uint8_t(rng() % 10);
    std::vector<std::int32_t> perm(static_cast<std::size_t>(n));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    cuda::DeviceBuffer dimg(images.size()), dlab(labels.size()), dperm(perm.size() * 4), dstep(4);
    dimg.upload(images.data(), images.size());
    dlab.upload(labels.data(), labels.size());
    dperm.upload(perm.data(), perm.size() * 4);
    for (std::int32_t step : {0, 7}) {
      INFO("cols " << cols << " step " << step);
      dstep.upload(&step, 4);
      DeviceArray<bf16> x(static_cast<std::size_t>(batch * cols));
      DeviceArray<std::int32_t> y(static_cast<std::size_t>(batch));
      cuda::launch_batch_fetch(dperm.as<std::int32_t>(), n, dstep.as<std::int32_t>(), batch, dimg.as<std::uint8_t>(),
                               cols, 1.f / 255.f, -0.5f, x.get(), dlab.as<std::uint8_t>(), y.get(), nullptr);
      std::vector<std::int32_t> idx(static_cast<std::size_t>(batch));
      ref::batch_indices(perm.data(), n, step, batch, idx.data());
      std::vector<float> xref(static_cast<std::size_t>(batch * cols));
      ref::gather_rows(images.data(), idx.data(), batch, cols, 1.f / 255.f, -0.5f, xref.data());
      std::vector<std::int32_t> yref(static_cast<std::size_t>(batch));
      ref::gather_rows_int(labels.data(), idx.data(), batch, 1, yref.data());
      // The GPU computes pixel*scale+shift as one FMA, the CPU reference
      // rounds the product first: for pixel 127 of this affine map the two
      // f32 results sit on either side of a bf16 midpoint, so compare by norm
      // (one bf16 rounding), not bit for bit.
      CHECK(sg::test::relative_error(x.download(), xref) < kOneRounding);
      const auto got_labels = y.download();
      for (std::size_t i = 0; i < yref.size(); ++i) CHECK(got_labels[i] == float(yref[i]));
    }
  }
}

TEST_CASE("cuBLASLt bf16 matmuls: every transpose, bias / relu_aux_bias / drelu epilogues, fused SGD into bf16 and fp32 W") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  cuda::LtHandle lt;
  const cuda::DeviceBuffer one_zero = [] {
    cuda::DeviceBuffer b(8);
    const float v[2] = {1.f, 0.f};
    b.upload(v, sizeof v);
    return b;
  }();
  const void* one = one_zero.data();
  const void* zero = one_zero.as<char>() + 4;
  for (int trial = 0; trial < 4; ++trial) {
    const std::int64_t m = 1 + std::int64_t(rng() % 257), n = 1 + std::int64_t(rng() % 300), k = 1 + std::int64_t(rng() % 784);
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        cuda::MatmulShape s{m, n, k, ta, tb, cuda::ElemType::bf16, cuda::ElemType::bf16, cuda::Accumulate::f32,
                            cuda::Epilogue::none};
        INFO(s.describe());
        const auto a = random_bf16(static_cast<std::size_t>(m * k), rng), b = random_bf16(static_cast<std::size_t>(k * n), rng);
        DeviceArray<bf16> da(a), db(b), d(static_cast<std::size_t>(m * n));
        cuda::LtMatmul mm(lt, s, false, nullptr);
        mm.run(da.get(), db.get(), d.get(), d.get(), one, zero, nullptr, nullptr, nullptr);
        std::vector<double> ad(a.begin(), a.end()), bd(b.begin(), b.end()), c(static_cast<std::size_t>(m * n));
        ref::matmul(ad.data(), bd.data(), c.data(), m, n, k, ta, tb);
        CHECK(sg::test::relative_error(d.download(), c) < kLongSums);
      }
  }
  // Linear forward (bias, relu_aux_bias) and the dgrad reading its mask.
  for (auto [batch, in, out] : std::vector<std::array<std::int64_t, 3>>{{{32, 784, 128}}, {{37, 65, 129}}, {{256, 128, 10}}}) {
    INFO(batch << " " << in << " " << out);
    const auto x = random_bf16(static_cast<std::size_t>(batch * in), rng);
    const auto w = random_bf16(static_cast<std::size_t>(out * in), rng, -0.2f, 0.2f);
    const auto bias = random_bf16(static_cast<std::size_t>(out), rng);
    std::vector<double> xd(x.begin(), x.end()), wd(w.begin(), w.end()), bd(bias.begin(), bias.end());
    std::vector<double> z(static_cast<std::size_t>(batch * out)), href(z.size());
    ref::matmul(xd.data(), wd.data(), z.data(), batch, out, in, false, true);
    ref::bias_add(z.data(), bd.data(), batch, out, z.data());
    ref::relu(z.data(), std::int64_t(z.size()), href.data());
    DeviceArray<bf16> dx(x), dw(w), db(bias), zout(z.size()), h(z.size());
    cuda::LtMatmul linear(lt, {batch, out, in, false, true, cuda::ElemType::bf16, cuda::ElemType::bf16,
                               cuda::Accumulate::f32, cuda::Epilogue::bias}, false, nullptr);
    linear.run(dx.get(), dw.get(), zout.get(), zout.get(), one, zero, db.get(), nullptr, nullptr);
    CHECK(sg::test::relative_error(zout.download(), z) < kLongSums);
    cuda::DeviceBuffer aux(cuda::relu_aux_bytes(batch, out));
    cuda::LtMatmul forward(lt, {batch, out, in, false, true, cuda::ElemType::bf16, cuda::ElemType::bf16,
                                cuda::Accumulate::f32, cuda::Epilogue::relu_aux_bias}, false, nullptr);
    forward.run(dx.get(), dw.get(), h.get(), h.get(), one, zero, db.get(), aux.data(), nullptr);
    CHECK(sg::test::relative_error(h.download(), href) < kLongSums);

    const std::int64_t next = 17;
    const auto dz2 = random_bf16(static_cast<std::size_t>(batch * next), rng);
    const auto w2 = random_bf16(static_cast<std::size_t>(next * out), rng);
    DeviceArray<bf16> ddz2(dz2), dw2(w2), dz(z.size());
    cuda::LtMatmul backward(lt, {batch, out, next, false, false, cuda::ElemType::bf16, cuda::ElemType::bf16,
                                 cuda::Accumulate::f32, cuda::Epilogue::drelu}, false, nullptr);
    backward.run(ddz2.get(), dw2.get(), dz.get(), dz.get(), one, zero, nullptr, aux.data(), nullptr);
    std::vector<double> dz2d(dz2.begin(), dz2.end()), w2d(w2.begin(), w2.end()), dh(z.size()), dzref(z.size());
    ref::matmul(dz2d.data(), w2d.data(), dh.data(), batch, out, next, false, false);
    // The mask comes from the f32 pre-activation; near z = 0 its sign may
    // differ from the exact sum's: excluded on both sides (as in test_matmul).
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
    CHECK(sg::test::relative_error(dzgot, dzref) < kLongSums);
  }
  // Fused SGD: dW = dz^T x straight into W (alpha = -lr, beta = 1 - lr*wd), W in bf16 or fp32.
  const std::int64_t batch = 32, in = 129, out = 37;
  const float lr = 0.1f, wdecay = 0.01f;
  const auto dz = random_bf16(static_cast<std::size_t>(batch * out), rng);
  const auto x = random_bf16(static_cast<std::size_t>(batch * in), rng);
  const auto w0 = random_bf16(static_cast<std::size_t>(out * in), rng);
  std::vector<double> dzd(dz.begin(), dz.end()), xd(x.begin(), x.end()), g(static_cast<std::size_t>(out * in));
  ref::matmul(dzd.data(), xd.data(), g.data(), out, in, batch, true, false);
  std::vector<double> wref(w0.begin(), w0.end());
  ref::sgd_update(wref.data(), g.data(), static_cast<double*>(nullptr), out * in, double(lr), 0.0, double(wdecay));
  DeviceArray<bf16> ddz(dz), dx(x);
  const cuda::DeviceBuffer ds = sg::test::device_update_scalars({cuda::make_update_scalars(lr, 0.f, wdecay)});
  const auto* sc = ds.as<cuda::UpdateScalars>();
  for (auto cd : {cuda::ElemType::bf16, cuda::ElemType::f32}) {
    INFO("W " << cuda::elem_type_name(cd));
    const cuda::MatmulShape shape{out, in, batch, true, false, cuda::ElemType::bf16, cd, cuda::Accumulate::f32,
                                  cuda::Epilogue::none, /*reads_c=*/true};
    cuda::LtMatmul mm(lt, shape, false, nullptr);
    std::vector<float> got;
    if (cd == cuda::ElemType::bf16) {
      DeviceArray<bf16> w(w0);
      mm.run(ddz.get(), dx.get(), w.get(), w.get(), &sc->neg_lr, &sc->one_minus_lr_wd, nullptr, nullptr, nullptr);
      got = w.download();
    } else {
      DeviceArray<float> w(w0);
      mm.run(ddz.get(), dx.get(), w.get(), w.get(), &sc->neg_lr, &sc->one_minus_lr_wd, nullptr, nullptr, nullptr);
      got = w.download();
    }
    CHECK(sg::test::relative_error(got, wref) < (cd == cuda::ElemType::bf16 ? kOneRounding : 1e-5));
  }
  // bf16 operands accumulate in fp32 only.
  CHECK_THROWS_AS(cuda::LtMatmul(lt, {out, in, batch, true, false, cuda::ElemType::bf16, cuda::ElemType::bf16,
                                      cuda::Accumulate::f16, cuda::Epilogue::none}, false, nullptr),
                  cuda::CudaError);
}
