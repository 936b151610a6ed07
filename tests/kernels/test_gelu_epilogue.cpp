// cuBLASLt's GELU epilogues against the CPU references: GELU_AUX_BIAS writes
// gelu_tanh(x W^T + b) and the pre-activation as aux, DGELU multiplies the
// dgrad by gelu_tanh' of that aux. With fp32 outputs the test also shows
// that cuBLASLt's GELU is the tanh approximation (ref::gelu_tanh), not the
// exact erf GELU (ref::gelu): the error against the former is far smaller.
#include <doctest/doctest.h>

#include <array>

#include "ops/cpu/reference_ops.hpp"
#include "ops/cuda/cublaslt_matmul.hpp"
#include "ops/cuda/fast_paths/small_batch_forward/small_batch_forward.hpp"
#include "ops/cuda/small_linear.hpp"
#include "tests/runtime/test_support.hpp"
#include "tests/support/device_array.hpp"

using namespace sg;
using sg::test::DeviceArray;

namespace {

struct Scalars {
  Scalars() : buf(8) {
    const float v[2] = {1.f, 0.f};
    buf.upload(v, sizeof v);
  }
  const void* alpha() const { return buf.data(); }
  const void* beta() const { return buf.as<char>() + 4; }
  cuda::DeviceBuffer buf;
};

// Runs forward (GELU_AUX_BIAS) and backward (DGELU) with outputs of type Out.
template <typename Out>
void check_gelu_epilogues(std::int64_t batch, std::int64_t in, std::int64_t out, bool autotune, std::mt19937_64& rng) {
  const cuda::ElemType cd = std::is_same_v<Out, float> ? cuda::ElemType::f32 : cuda::ElemType::f16;
  INFO(batch << " " << in << " " << out << " autotune " << autotune << " out " << cuda::elem_type_name(cd));
  cuda::LtHandle lt;
  Scalars sc;
  cuda::MatmulShape fwd{batch, out, in, false, true, cuda::ElemType::f16, cd, cuda::Accumulate::f32,
                        cuda::Epilogue::gelu_aux_bias};
  // Inputs scaled so the pre-activations spread over [-4, 4], where the two GELUs differ most.
  const auto x = sg::test::representable<__half>(sg::test::uniform(static_cast<std::size_t>(batch * in), rng));
  const float wscale = 4.f / std::sqrt(static_cast<float>(in));
  const auto w = sg::test::representable<__half>(
      sg::test::uniform(static_cast<std::size_t>(out * in), rng, -2.f * wscale, 2.f * wscale));
  const auto bias = sg::test::representable<Out>(sg::test::uniform(static_cast<std::size_t>(out), rng));
  DeviceArray<__half> dx(x), dw(w);
  DeviceArray<Out> db(bias), h(static_cast<std::size_t>(batch * out)), aux(static_cast<std::size_t>(batch * out));
  cuda::LtMatmul forward(lt, fwd, autotune, nullptr, /*autotune_min_macs=*/0);
  forward.run(dx.get(), dw.get(), h.get(), h.get(), sc.alpha(), sc.beta(), db.get(), aux.get(), nullptr);

  std::vector<double> xd(x.begin(), x.end()), wd(w.begin(), w.end()), bd(bias.begin(), bias.end());
  std::vector<double> z(static_cast<std::size_t>(batch * out)), tanh_ref(z.size()), exact_ref(z.size());
  ref::matmul(xd.data(), wd.data(), z.data(), batch, out, in, false, true);
  ref::bias_add(z.data(), bd.data(), batch, out, z.data());
  ref::gelu_tanh(z.data(), std::int64_t(z.size()), tanh_ref.data());
  ref::gelu(z.data(), std::int64_t(z.size()), exact_ref.data());
  const auto hgot = h.download();
  const double tol = std::is_same_v<Out, float> ? 1e-5 : 3e-3;
  CHECK(sg::test::relative_error(aux.download(), z) < tol);  // the pre-activation, as aux
  const double err_tanh = sg::test::relative_error(hgot, tanh_ref);
  CHECK(err_tanh < tol);
  if (std::is_same_v<Out, float>) {
    const double err_exact = sg::test::relative_error(hgot, exact_ref);
    MESSAGE("GELU epilogue vs gelu_tanh " << err_tanh << ", vs exact erf GELU " << err_exact);
    CHECK(err_tanh * 10 < err_exact);
  }

  // dz = (dy W2) * gelu_tanh'(z), z read back from the aux the forward wrote.
  const std::int64_t next = 24;
  cuda::MatmulShape bwd{batch, out, next, false, false, cuda::ElemType::f16, cd, cuda::Accumulate::f32,
                        cuda::Epilogue::dgelu};
  const auto dy = sg::test::representable<__half>(sg::test::uniform(static_cast<std::size_t>(batch * next), rng));
  const auto w2 = sg::test::representable<__half>(sg::test::uniform(static_cast<std::size_t>(next * out), rng));
  DeviceArray<__half> ddy(dy), dw2(w2);
  DeviceArray<Out> dz(static_cast<std::size_t>(batch * out));
  cuda::LtMatmul backward(lt, bwd, autotune, nullptr, /*autotune_min_macs=*/0);
  backward.run(ddy.get(), dw2.get(), dz.get(), dz.get(), sc.alpha(), sc.beta(), nullptr, aux.get(), nullptr);
  const auto aux_host = aux.download();
  std::vector<double> dyd(dy.begin(), dy.end()), w2d(w2.begin(), w2.end()), dh(z.size()), zaux(aux_host.begin(), aux_host.end()),
      dzref(z.size());
  ref::matmul(dyd.data(), w2d.data(), dh.data(), batch, out, next, false, false);
  ref::gelu_tanh_backward(dh.data(), zaux.data(), std::int64_t(z.size()), dzref.data());
  CHECK(sg::test::relative_error(dz.download(), dzref) < tol);
}

}  // namespace

TEST_CASE("cuBLASLt GELU_AUX_BIAS and DGELU compute gelu_tanh and its gradient (heuristic and autotuned)") {
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  for (auto [batch, in, out] : std::vector<std::array<std::int64_t, 3>>{{{32, 784, 128}}, {{37, 65, 136}}, {{256, 128, 64}}})
    for (bool autotune : {false, true}) {
      check_gelu_epilogues<__half>(batch, in, out, autotune, rng);
      check_gelu_epilogues<float>(batch, in, out, autotune, rng);
    }
}

TEST_CASE("at batch 16/32 our kernels' gelu_tanh forward and dgrad agree with GELU_AUX_BIAS and DGELU") {
  // What replaces the epilogues at small batches (small_batch_forward with its pre-activation,
  // small_k_dgrad_relu through gelu_tanh_backward) against cuBLASLt on the same inputs.
  auto rng = sg::test::fresh_rng();
  INFO("random seed " << sg::test::last_seed());
  cuda::LtHandle lt;
  Scalars sc;
  for (auto [batch, in, out] : std::vector<std::array<std::int64_t, 3>>{{{32, 784, 128}}, {{16, 64, 1024}}}) {
    INFO(batch << " " << in << " " << out);
    const auto x = sg::test::representable<__half>(sg::test::uniform(static_cast<std::size_t>(batch * in), rng));
    const float wscale = 4.f / std::sqrt(static_cast<float>(in));
    const auto w = sg::test::representable<__half>(
        sg::test::uniform(static_cast<std::size_t>(out * in), rng, -2.f * wscale, 2.f * wscale));
    const auto bias = sg::test::representable<__half>(sg::test::uniform(static_cast<std::size_t>(out), rng));
    DeviceArray<__half> dx(x), dw(w), db(bias), h_lt(std::size_t(batch * out)), z_lt(std::size_t(batch * out)),
        h_ours(std::size_t(batch * out)), z_ours(std::size_t(batch * out));
    cuda::LtMatmul forward(lt, {batch, out, in, false, true, cuda::ElemType::f16, cuda::ElemType::f16,
                                cuda::Accumulate::f32, cuda::Epilogue::gelu_aux_bias},
                           false, nullptr);
    forward.run(dx.get(), dw.get(), h_lt.get(), h_lt.get(), sc.alpha(), sc.beta(), db.get(), z_lt.get(), nullptr);
    cuda::SmallBatchLinear args;
    args.x = dx.get();
    args.w = dw.get();
    args.bias = db.get();
    args.y = h_ours.get();
    args.batch = int(batch);
    args.n = int(out);
    args.k = int(in);
    args.activation = cuda::Activation::gelu_tanh;
    args.pre_activation = z_ours.get();
    cuda::launch_small_batch_linear(args, nullptr, true);
    CHECK(sg::test::relative_error(z_ours.download(), z_lt.download()) < 3e-3);
    CHECK(sg::test::relative_error(h_ours.download(), h_lt.download()) < 3e-3);

    const std::int64_t next = 10;  // a classifier's dgrad: K <= 32 terms
    const auto dy = sg::test::representable<__half>(sg::test::uniform(static_cast<std::size_t>(batch * next), rng));
    const auto w2 = sg::test::representable<__half>(sg::test::uniform(static_cast<std::size_t>(next * out), rng));
    DeviceArray<__half> ddy(dy), dw2(w2), dz_lt(std::size_t(batch * out)), dz_ours(std::size_t(batch * out));
    cuda::LtMatmul backward(lt, {batch, out, next, false, false, cuda::ElemType::f16, cuda::ElemType::f16,
                                 cuda::Accumulate::f32, cuda::Epilogue::dgelu},
                            false, nullptr);
    backward.run(ddy.get(), dw2.get(), dz_lt.get(), dz_lt.get(), sc.alpha(), sc.beta(), nullptr, z_lt.get(), nullptr);
    cuda::launch_dgrad_activation_small_k(cuda::Activation::gelu_tanh, ddy.get(), dw2.get(), z_lt.get(), batch, out,
                                          next, dz_ours.get(), nullptr, true);
    CHECK(sg::test::relative_error(dz_ours.download(), dz_lt.download()) < 3e-3);
  }
}

TEST_CASE("a GELU aux whose width is not a multiple of 8 is refused with the rule") {
  cuda::LtHandle lt;
  cuda::MatmulShape s{32, 100, 64, false, true, cuda::ElemType::f16, cuda::ElemType::f16, cuda::Accumulate::f32,
                      cuda::Epilogue::gelu_aux_bias};
  CHECK_THROWS_WITH_AS(cuda::LtMatmul(lt, s, false, nullptr), doctest::Contains("multiple of 8"), cuda::CudaError);
}
