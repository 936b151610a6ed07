// The tensor-core channels-last convolutions (ops/cuda/fast_paths/tensor_core_conv/conv_nhwc_mma.cu)
// called directly against the CPU reference in double: forward (+bias,
// +relu) at strides 1 and 2 and backward data, every tile, f16 and bf16, on
// random shapes (odd sizes, 16-144 channels, 1x1 to 5x5 kernels, padding
// 0..k-1) and on the shipped CNNs' layers at a small batch, each planned for
// 132 multiprocessors and for 2 (a resident-filter block then walks several
// units). Outputs are poisoned (NaN) first, so an element left unwritten
// fails; a second run must give the same bits.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <random>
#include <vector>

#include "ops/cuda/fast_paths/tensor_core_conv/conv_nhwc_mma.hpp"
#include "tests/kernels/channels_last_test_support.hpp"
#include "tests/support/filter_layouts.hpp"

using namespace sg;
using namespace sg::test::channels_last;

namespace {

struct Case {
  cuda::NhwcConvShape shape;
  bool bias = false, relu = false;
};

// The pass on the GPU against the reference, the filter given [o,c,kh,kw] or (krsc) [o,kh,kw,c]; "" when it matches.
template <typename T>
std::string check_case(cuda::NhwcConvPass pass, const Case& k, int tile, int sm_count, std::mt19937_64& rng,
                       bool krsc) {
  const cuda::NhwcConvShape& f = k.shape;
  const std::int64_t hw = f.h * f.w, ohw = f.oh() * f.ow();
  ref::Conv2dGeometry g{f.n, f.c, f.h, f.w, f.o, f.kh, f.kw, f.stride, f.padding};
  const bool data = pass == cuda::NhwcConvPass::backward_data;
  // Inputs drawn in NCHW, rounded to T, uploaded channels-last.
  std::vector<float> in(static_cast<std::size_t>(data ? f.n * f.o * ohw : f.n * f.c * hw));
  std::vector<float> w(static_cast<std::size_t>(f.o * f.c * f.kh * f.kw)), b(static_cast<std::size_t>(f.o));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto* v : {&in, &w, &b})
    for (float& e : *v) e = round_to<T>(u(rng));
  const std::vector<double> in_d(in.begin(), in.end()), w_d(w.begin(), w.end()), b_d(b.begin(), b.end());
  std::vector<double> want(static_cast<std::size_t>(data ? f.n * f.c * hw : f.n * f.o * ohw));
  if (data) {
    ref::conv2d_backward_data(in_d.data(), w_d.data(), g, want.data());
  } else {
    ref::conv2d(in_d.data(), w_d.data(), k.bias ? b_d.data() : nullptr, g, want.data());
    if (k.relu)
      for (double& e : want) e = e > 0 ? e : 0;
  }
  const std::int64_t in_channels = data ? f.o : f.c, out_channels = data ? f.c : f.o;
  const Tensor<T> input(to_nhwc(in, f.n, data ? ohw : hw, in_channels), 0), bias(b, 0);
  const Tensor<T> filter(krsc ? sg::test::filter_to_krsc(w, f.o, f.c, f.kh * f.kw) : w, 0);
  const Tensor<T> output(want.size()), rewritten(static_cast<std::size_t>(f.o * f.c * f.kh * f.kw));
  cuda::NhwcConvPlan plan = cuda::plan_nhwc_conv(pass, f, tile, sm_count);
  plan.filter_krsc = krsc;
  const auto run = [&] {
    cuda::launch_nhwc_conv(plan, input.get(), filter.get(), k.bias ? bias.get() : nullptr, k.relu, output.get(),
                           rewritten.get(), nullptr);
    return to_nchw(output.download(), f.n, data ? hw : ohw, out_channels);
  };
  const std::vector<float> got = run();
  const double err = sg::test::relative_error(got, want);
  const double tolerance = std::is_same_v<T, __half> ? 2e-3 : 1.2e-2;
  if (!(err < tolerance))
    return fmt::format("{}{}: relative error {:.3g} (tolerance {})", plan.describe(),
                       krsc ? ", [o,kh,kw,c] filter" : "", err, tolerance);
  const std::string again = bit_difference(run(), got);
  if (!again.empty()) return plan.describe() + ": a second run differs: " + again;
  return "";
}

std::string describe(cuda::NhwcConvPass pass, const Case& k) {
  const cuda::NhwcConvShape& f = k.shape;
  return fmt::format("{} n={} {}x{} c={} o={} k={}x{} stride={} padding={}{}{}",
                     pass == cuda::NhwcConvPass::forward ? "forward" : "backward data", f.n, f.h, f.w, f.c, f.o, f.kh,
                     f.kw, f.stride, f.padding, k.bias ? " +bias" : "", k.relu ? " +relu" : "");
}

template <typename T>
void check_all_tiles(cuda::NhwcConvPass pass, const Case& k, std::mt19937_64& rng) {
  INFO(type_name<T>(), " ", describe(pass, k));
  REQUIRE(cuda::nhwc_conv_why_not(pass, k.shape) == "");
  // 132 multiprocessors (an H200's), and 2: the resident form's blocks then walk several units each; the
  // filter in the parameter's layout, and (132 only) [o,kh,kw,c] (graph/filter_layout_pass.hpp).
  for (const int sm_count : {132, 2})
    for (const bool krsc : {false, true})
      for (int tile = -1; tile < cuda::nhwc_conv_tile_count() && (sm_count == 132 || !krsc); ++tile) {
        const std::string problem = check_case<T>(pass, k, tile, sm_count, rng, krsc);
        CHECK_MESSAGE(problem.empty(), problem);
      }
}

std::vector<Case> random_cases(std::mt19937_64& rng, bool stride_one) {
  const std::int64_t channels[] = {16, 32, 48, 64, 144};
  const std::int64_t outs[] = {8, 16, 24, 32, 64, 136};
  std::vector<Case> cases;
  for (int i = 0; i < 8; ++i) {
    Case k;
    const std::int64_t kernel = 2 * pick(rng, 0, 2) + 1;
    k.shape = {pick(rng, 1, 3),
               pick(rng, kernel, 13),
               pick(rng, kernel, 13),
               channels[pick(rng, 0, 4)],
               outs[pick(rng, 0, 5)],
               kernel,
               kernel,
               stride_one ? 1 : pick(rng, 1, 2),
               pick(rng, 0, kernel - 1)};
    k.bias = i % 2 == 0;
    k.relu = i % 3 != 0;
    cases.push_back(k);
  }
  return cases;
}

}  // namespace

TEST_CASE("tensor-core NHWC conv forward (+bias +relu) matches the CPU reference on random shapes and every tile") {
  std::mt19937_64 rng = sg::test::fresh_rng();
  INFO("random seed ", sg::test::last_seed());
  for (const Case& k : random_cases(rng, false)) {
    check_all_tiles<__half>(cuda::NhwcConvPass::forward, k, rng);
    check_all_tiles<__nv_bfloat16>(cuda::NhwcConvPass::forward, k, rng);
  }
}

TEST_CASE("tensor-core NHWC conv backward data matches the CPU reference on random shapes and every tile") {
  std::mt19937_64 rng = sg::test::fresh_rng();
  INFO("random seed ", sg::test::last_seed());
  for (Case k : random_cases(rng, true)) {
    k.bias = k.relu = false;
    // The pass reads o channels and writes c: swap the draws so both run through the channel lists.
    std::swap(k.shape.c, k.shape.o);
    if (k.shape.o % 16 != 0) k.shape.o += 8;
    check_all_tiles<__half>(cuda::NhwcConvPass::backward_data, k, rng);
    check_all_tiles<__nv_bfloat16>(cuda::NhwcConvPass::backward_data, k, rng);
  }
}

TEST_CASE("tensor-core NHWC conv on the shipped CNNs' layers (mnist_resnet and mnist_cnn_fast) at batch 2") {
  std::mt19937_64 rng(3);
  const std::vector<Case> layers = {
      {{2, 28, 28, 32, 32, 3, 3, 1, 1}}, {{2, 14, 14, 32, 64, 3, 3, 1, 1}}, {{2, 14, 14, 64, 64, 3, 3, 1, 1}},
      {{2, 7, 7, 64, 128, 3, 3, 1, 1}},  {{2, 14, 14, 32, 64, 5, 5, 1, 2}, true, true}};
  for (const Case& k : layers) {
    check_all_tiles<__half>(cuda::NhwcConvPass::forward, k, rng);
    Case d = k;
    d.bias = d.relu = false;
    check_all_tiles<__half>(cuda::NhwcConvPass::backward_data, d, rng);
  }
}

TEST_CASE("the tensor-core NHWC conv refuses what it is not built for, with the reason") {
  using cuda::NhwcConvPass;
  CHECK(cuda::nhwc_conv_why_not(NhwcConvPass::forward, {1, 8, 8, 3, 32, 3, 3, 1, 1}) ==
        "3 channels are read: not a multiple of 16");
  CHECK(cuda::nhwc_conv_why_not(NhwcConvPass::forward, {1, 8, 8, 16, 12, 3, 3, 1, 1}) ==
        "12 channels are written: not a multiple of 8");
  CHECK(cuda::nhwc_conv_why_not(NhwcConvPass::backward_data, {1, 8, 8, 16, 32, 3, 3, 2, 1}) ==
        "stride 2: the backward data pass is built for stride 1");
  CHECK(cuda::nhwc_conv_why_not(NhwcConvPass::backward_data, {1, 8, 8, 16, 32, 3, 3, 1, 1}) == "");
  CHECK_THROWS(cuda::plan_nhwc_conv(NhwcConvPass::forward, {1, 8, 8, 3, 32, 3, 3, 1, 1}, -1, 132));
}
