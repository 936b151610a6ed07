// The few-channel channels-last convolutions (ops/cuda/fast_paths/few_channel_conv/)
// called directly against the CPU reference in double: the forward (+bias,
// +relu) and the weight gradient (+ the bias gradient, in T or widened to
// f32), f16 and bf16, on random shapes (1-4 input channels, 1-128 output
// channels, odd counts included, 1x1 to 7x7 kernels, strides 1 and 2, padding 0..k-1, odd sizes,
// batch 1-5) and on the shipped networks' first layers; the weight gradient
// also through each activation's backward (its gate); the forward with the
// batch fetch and the parameters' casts in its launch against the launches
// it replaces. Outputs are poisoned (NaN) first, so an element left
// unwritten fails; a second run must give the same bits.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <random>
#include <vector>

#include "ops/cuda/fast_paths/few_channel_conv/few_channel_conv.hpp"
#include "ops/cuda/kernels.hpp"
#include "tests/kernels/channels_last_test_support.hpp"
#include "tests/support/activation_reference.hpp"

using namespace sg;
using namespace sg::test::channels_last;

namespace {

struct Case {
  cuda::FewChannelConvShape shape;
  bool bias = false, relu = false;
};

std::string describe(const Case& k) {
  const cuda::FewChannelConvShape& f = k.shape;
  return fmt::format("n={} {}x{} c={} o={} k={}x{} stride={} padding={}{}{}", f.n, f.h, f.w, f.c, f.o, f.kh, f.kw,
                     f.stride, f.padding, k.bias ? " +bias" : "", k.relu ? " +relu" : "");
}

ref::Conv2dGeometry geometry(const cuda::FewChannelConvShape& f) {
  return {f.n, f.c, f.h, f.w, f.o, f.kh, f.kw, f.stride, f.padding};
}

std::vector<float> draw(std::size_t count, std::mt19937_64& rng, float (*round)(float)) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(count);
  for (float& e : v) e = round(u(rng));
  return v;
}

template <typename T>
double tolerance() {
  return std::is_same_v<T, __half> ? 2e-3 : 1.2e-2;
}

// The forward on the GPU against the reference; "" when it matches.
template <typename T>
std::string check_forward(const Case& k, std::mt19937_64& rng, int band) {
  const cuda::FewChannelConvShape& f = k.shape;
  const std::int64_t hw = f.h * f.w, ohw = f.oh() * f.ow();
  const std::vector<float> x = draw(std::size_t(f.n * f.c * hw), rng, round_to<T>);
  const std::vector<float> w = draw(std::size_t(f.o * f.c * f.kh * f.kw), rng, round_to<T>);
  const std::vector<float> b = draw(std::size_t(f.o), rng, round_to<T>);
  const std::vector<double> xd(x.begin(), x.end()), wd(w.begin(), w.end()), bd(b.begin(), b.end());
  std::vector<double> want(std::size_t(f.n * f.o * ohw));
  ref::conv2d(xd.data(), wd.data(), k.bias ? bd.data() : nullptr, geometry(f), want.data());
  if (k.relu)
    for (double& e : want) e = e > 0 ? e : 0;
  // The input one element past its alignment: the kernels read it element by element.
  const Tensor<T> input(to_nhwc(x, f.n, hw, f.c), 1), filter(w, 0), bias(b, 0), output(want.size());
  const cuda::FewChannelForwardPlan plan = cuda::plan_few_channel_forward(f, 132, band);
  const auto run = [&] {
    cuda::launch_few_channel_forward(plan, input.get(), filter.get(), k.bias ? bias.get() : nullptr, k.relu,
                                     output.get(), nullptr);
    return to_nchw(output.download(), f.n, ohw, f.o);
  };
  const std::vector<float> got = run();
  const double err = sg::test::relative_error(got, want);
  if (!(err < tolerance<T>())) return fmt::format("{}: relative error {:.3g}", plan.describe(), err);
  const std::string again = bit_difference(run(), got);
  return again.empty() ? "" : plan.describe() + ": a second run differs: " + again;
}

// The weight gradient (and the bias gradient, as B) against the reference;
// with `gate`, of act_backward(dY, saved) rounded to T (the activation's
// backward staged in the kernel), saved drawn around 0 so ReLU's gate cuts.
template <typename T, typename B>
std::string check_wgrad(const Case& k, std::mt19937_64& rng, int band,
                        std::optional<cuda::Activation> gate = std::nullopt) {
  const cuda::FewChannelConvShape& f = k.shape;
  const std::int64_t hw = f.h * f.w, ohw = f.oh() * f.ow();
  const std::vector<float> x = draw(std::size_t(f.n * f.c * hw), rng, round_to<T>);
  const std::vector<float> incoming = draw(std::size_t(f.n * f.o * ohw), rng, round_to<T>);
  const std::vector<float> saved = draw(incoming.size(), rng, round_to<T>);
  std::vector<float> dy = incoming;
  if (gate) {
    const std::vector<double> gated = sg::test::activation_backward(*gate, {incoming.begin(), incoming.end()},
                                                                    {saved.begin(), saved.end()});
    for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = round_to<T>(float(gated[i]));
  }
  const std::vector<double> xd(x.begin(), x.end()), dyd(dy.begin(), dy.end());
  std::vector<double> want(std::size_t(f.o * f.c * f.kh * f.kw)), want_db(std::size_t(f.o), 0.0);
  ref::conv2d_backward_filter(dyd.data(), xd.data(), geometry(f), want.data());
  for (std::int64_t n = 0; n < f.n; ++n)
    for (std::int64_t o = 0; o < f.o; ++o)
      for (std::int64_t p = 0; p < ohw; ++p) want_db[std::size_t(o)] += dyd[std::size_t((n * f.o + o) * ohw + p)];
  const Tensor<T> input(to_nhwc(x, f.n, hw, f.c), 1), grad(to_nhwc(gate ? incoming : dy, f.n, ohw, f.o), 0),
      kept(to_nhwc(saved, f.n, ohw, f.o), 0), dw(want.size());
  const Tensor<B> db(std::size_t(f.o));
  const cuda::FewChannelWgrad kernel(f, k.bias, 132, band, gate);
  const auto run = [&] {
    kernel.run(grad.get(), input.get(), dw.get(), k.bias ? db.get() : static_cast<B*>(nullptr), nullptr,
               gate ? kept.get() : nullptr);
    std::vector<float> out = dw.download();
    if (k.bias)
      for (float v : db.download()) out.push_back(v);
    return out;
  };
  const std::vector<float> got = run();
  const std::vector<float> got_dw(got.begin(), got.begin() + std::ptrdiff_t(want.size()));
  double err = sg::test::relative_error(got_dw, want);
  if (k.bias) {
    const std::vector<float> got_db(got.begin() + std::ptrdiff_t(want.size()), got.end());
    err = std::max(err, sg::test::relative_error(got_db, want_db));
  }
  if (!(err < tolerance<T>())) return fmt::format("{}: relative error {:.3g}", kernel.describe(), err);
  const std::string again = bit_difference(run(), got);
  return again.empty() ? "" : kernel.describe() + ": a second run differs: " + again;
}

// band 0: the planned bands.
template <typename T>
void check_case(const Case& k, std::mt19937_64& rng, int band = 0) {
  INFO(type_name<T>(), " ", describe(k), " band ", band);
  REQUIRE(cuda::few_channel_conv_why_not(k.shape) == "");
  const std::string forward = check_forward<T>(k, rng, band);
  CHECK_MESSAGE(forward.empty(), "forward: " << forward);
  const std::string wgrad = check_wgrad<T, T>(k, rng, band);
  CHECK_MESSAGE(wgrad.empty(), "weight gradient: " << wgrad);
  if (k.bias) {
    const std::string widened = check_wgrad<T, float>(k, rng, band);
    CHECK_MESSAGE(widened.empty(), "weight gradient, f32 bias gradient: " << widened);
  }
}

// The forward reading the dataset's u8 rows and the fp32 master parameters
// (FewChannelForwardArgs: fetch, params_f32) against batch_fetch, the casts
// and the plain forward: y, X and the labels bit for bit. One channel (the
// table's rows are X's images), `ranks` ranks' slices of a shuffled table.
template <typename T>
void check_fetching_forward(const cuda::FewChannelConvShape& f, std::int64_t rank, std::int64_t ranks,
                            std::mt19937_64& rng) {
  INFO(type_name<T>(), " ", describe({f, true, true}), " rank ", rank, " of ", ranks);
  const std::int64_t cols = f.h * f.w * f.c, rows = f.n * ranks * 3 + 1, ohw = f.oh() * f.ow();
  std::vector<float> table(static_cast<std::size_t>(rows * cols)), labels(static_cast<std::size_t>(rows)),
      perm(static_cast<std::size_t>(rows));
  for (float& v : table) v = float(rng() % 256);
  for (float& v : labels) v = float(rng() % 10);
  for (std::size_t i = 0; i < perm.size(); ++i) perm[i] = float(i);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> w(static_cast<std::size_t>(f.o * f.c * f.kh * f.kw)), b(static_cast<std::size_t>(f.o));
  for (float& v : w) v = u(rng);  // fp32 master values: not representable in T
  for (float& v : b) v = u(rng);
  std::vector<float> w_t(w), b_t(b);
  for (float& v : w_t) v = round_to<T>(v);
  for (float& v : b_t) v = round_to<T>(v);
  const float scale = 1.f / 255.f / 0.3081f, shift = -0.1307f / 0.3081f;
  const Tensor<std::uint8_t> d_table(table, 0), d_labels(labels, 0);
  const Tensor<std::int32_t> d_perm(perm, 0), d_step(std::vector<float>{5.f}, 0);
  const Tensor<float> master_w(w, 0), master_b(b, 0);
  const Tensor<T> cast_w(w_t, 0), cast_b(b_t, 0);
  // The launches it replaces.
  const Tensor<T> x(std::size_t(f.n * cols)), y_want(std::size_t(f.n * ohw * f.o));
  const Tensor<std::int32_t> labels_want(std::size_t(f.n));
  cuda::launch_batch_fetch(d_perm.get(), rows, d_step.get(), f.n, d_table.get(), cols, scale, shift, x.get(),
                           d_labels.get(), labels_want.get(), nullptr, rank, ranks);
  const cuda::FewChannelForwardPlan plan = cuda::plan_few_channel_forward(f, 132);
  cuda::launch_few_channel_forward(plan, x.get(), cast_w.get(), cast_b.get(), true, y_want.get(), nullptr);
  // One launch.
  const Tensor<T> x_out(std::size_t(f.n * cols)), y(std::size_t(f.n * ohw * f.o));
  const Tensor<std::int32_t> labels_out(std::size_t(f.n));
  cuda::FewChannelForwardArgs a;
  a.fetch = {d_perm.get(), rows, d_step.get(), rank, ranks, d_table.get(), scale, shift, d_labels.get(), x_out.get(),
             labels_out.get()};
  a.w = master_w.get();
  a.bias = master_b.get();
  a.params_f32 = true;
  a.relu = true;
  a.y = y.get();
  cuda::launch_few_channel_forward<T>(plan, a, nullptr);
  CHECK(bit_difference(y.download(), y_want.download()) == "");
  CHECK(bit_difference(x_out.download(), x.download()) == "");
  CHECK(labels_out.download() == labels_want.download());
  // Without X's output (an eval graph): the same y.
  const Tensor<T> y_alone(std::size_t(f.n * ohw * f.o));
  a.fetch.x_out = nullptr;
  a.y = y_alone.get();
  cuda::launch_few_channel_forward<T>(plan, a, nullptr);
  CHECK(bit_difference(y_alone.download(), y_want.download()) == "");
}

}  // namespace

TEST_CASE("few-channel NHWC forward with the batch fetch and the fp32 parameters' casts in its launch") {
  std::mt19937_64 rng = sg::test::fresh_rng();
  INFO("random seed ", sg::test::last_seed());
  // mnist_cnn_fast's and wide_adam's first layers, odd sizes with stride 2, forced one-row bands (every band
  // writes its own rows of X, the last one the rest), two ranks' slices.
  check_fetching_forward<__half>({128, 28, 28, 1, 32, 5, 5, 1, 2}, 0, 1, rng);
  check_fetching_forward<__nv_bfloat16>({64, 28, 28, 1, 64, 3, 3, 1, 1}, 0, 1, rng);
  check_fetching_forward<__half>({5, 23, 17, 1, 16, 3, 3, 2, 1}, 1, 2, rng);
  check_fetching_forward<__nv_bfloat16>({3, 19, 21, 1, 8, 5, 5, 2, 0}, 0, 3, rng);
  check_fetching_forward<__half>({4, 28, 28, 1, 6, 5, 5, 1, 2}, 0, 1, rng);  // LeNet-5's 6 filters
  check_fetching_forward<__nv_bfloat16>({3, 15, 13, 1, 5, 3, 3, 1, 1}, 0, 1, rng);  // an odd count
}

TEST_CASE("few-channel NHWC conv forward and weight gradient match the CPU reference on random shapes") {
  std::mt19937_64 rng = sg::test::fresh_rng();
  INFO("random seed ", sg::test::last_seed());
  for (int i = 0; i < 16; ++i) {
    Case k;
    const std::int64_t kh = pick(rng, 1, 7), kw = i % 4 == 0 ? pick(rng, 1, 7) : kh;
    const std::int64_t stride = pick(rng, 1, 2), padding = pick(rng, 0, std::min(kh, kw) - 1);
    // Whole mma tiles of output channels, or any count (an odd one stores channel by channel).
    const std::int64_t outputs = i % 2 == 0 ? 8 * pick(rng, 1, 16) : pick(rng, 1, 24);
    k.shape = {pick(rng, 1, 5), pick(rng, kh, 23), pick(rng, kw, 23), pick(rng, 1, 4), outputs,
               kh, kw, stride, padding};
    k.bias = i % 4 < 2;
    k.relu = i % 3 != 0;
    check_case<__half>(k, rng);
    check_case<__nv_bfloat16>(k, rng);
  }
}

TEST_CASE("few-channel NHWC conv on the shipped networks' first layers") {
  std::mt19937_64 rng(5);
  // mnist_cnn_fast (5x5, 1 -> 32, bias + relu), mnist_resnet (3x3, 1 -> 32,
  // no bias), an RGB stem (7x7 stride 2, 3 -> 64) at batch 3.
  for (const Case& k : {Case{{3, 28, 28, 1, 32, 5, 5, 1, 2}, true, true}, Case{{3, 28, 28, 1, 32, 3, 3, 1, 1}},
                        Case{{3, 40, 36, 3, 64, 7, 7, 2, 3}, true, true}})
    check_case<__half>(k, rng);
  // LeNet-5's (5x5 padded, 1 -> 6) and bench/networks/c4_gelu_adam's (3x3, 1 -> 4): fewer filters than an mma tile.
  for (const Case& k : {Case{{3, 28, 28, 1, 6, 5, 5, 1, 2}, true, false}, Case{{3, 28, 28, 1, 4, 3, 3, 1, 1}, true}})
    check_case<__nv_bfloat16>(k, rng);
  // A batch of 130 (more blocks than 2 x 132 multiprocessors ask for).
  check_case<__nv_bfloat16>({{130, 28, 28, 1, 32, 5, 5, 1, 2}, true, true}, rng);
  // Forced bands: one row (tiles past a band's pixels), and 9 rows of 28 (a last band of one row).
  for (const int band : {1, 9}) check_case<__half>({{2, 28, 28, 1, 32, 5, 5, 1, 2}, true, true}, rng, band);
}

// The activation after the layer, its backward staged by the weight
// gradient's kernel (the gate), for each activation on random shapes.
TEST_CASE("few-channel NHWC weight gradient through each activation's backward matches the CPU reference") {
  std::mt19937_64 rng = sg::test::fresh_rng();
  INFO("random seed ", sg::test::last_seed());
  int i = 0;
  for (const cuda::Activation a : sg::test::kActivations)
    for (const bool bias : {false, true}) {
      INFO(cuda::activation_op_name(a), bias ? " with the bias gradient" : "");
      Case k;
      const std::int64_t kh = pick(rng, 1, 5), stride = pick(rng, 1, 2), padding = pick(rng, 0, kh - 1);
      const std::int64_t outputs = i % 2 == 0 ? 8 * pick(rng, 1, 16) : pick(rng, 1, 24);
      k.shape = {pick(rng, 1, 4), pick(rng, kh, 23), pick(rng, kh, 23), pick(rng, 1, 4), outputs,
                 kh, kh, stride, padding};
      k.bias = bias;
      INFO(describe(k));
      const int band = ++i % 3 == 0 ? 1 : 0;
      const std::string half = check_wgrad<__half, __half>(k, rng, band, a);
      CHECK_MESSAGE(half.empty(), "f16: " << half);
      const std::string wide = check_wgrad<__nv_bfloat16, float>(k, rng, band, a);
      CHECK_MESSAGE(wide.empty(), "bf16, f32 bias gradient: " << wide);
    }
  // bench/networks/wide_adam.yaml's first layer (batch 64) with its ReLU gate, on the planned bands.
  const std::string shipped = check_wgrad<__half, float>({{64, 28, 28, 1, 64, 3, 3, 1, 1}, true, true}, rng, 0,
                                                         cuda::Activation::relu);
  CHECK_MESSAGE(shipped.empty(), "64 x 28 x 28, 1 -> 64, 3x3: " << shipped);
}

TEST_CASE("the few-channel NHWC conv refuses what it is not built for, with the reason") {
  CHECK(cuda::few_channel_conv_why_not({1, 8, 8, 5, 32, 3, 3, 1, 1}) == "5 input channels (these kernels take 1-4)");
  CHECK(cuda::few_channel_conv_why_not({1, 8, 8, 1, 0, 3, 3, 1, 1}) == "0 output channels (these kernels take 1-128)");
  CHECK(cuda::few_channel_conv_why_not({1, 8, 8, 1, 5, 3, 3, 1, 1}) == "");
  CHECK(cuda::few_channel_conv_why_not({1, 16, 16, 1, 8, 9, 9, 1, 1}) == "a 9x9 kernel (these kernels take up to 7x7)");
  CHECK(cuda::few_channel_conv_why_not({1, 8, 8, 1, 8, 3, 3, 3, 1}) == "stride 3 (these kernels take 1 or 2)");
  CHECK(cuda::few_channel_conv_why_not({1, 8, 8, 1, 8, 3, 3, 1, 3}) ==
        "padding 3 with a 3x3 kernel (these kernels take less than the kernel)");
  CHECK(cuda::few_channel_conv_why_not({1, 8, 8, 1, 136, 3, 3, 1, 1}) ==
        "136 output channels (these kernels take 1-128)");
  CHECK(cuda::few_channel_conv_why_not({1, 8, 8, 3, 64, 3, 3, 1, 1}) == "");
  CHECK_THROWS(cuda::plan_few_channel_forward({1, 8, 8, 5, 32, 3, 3, 1, 1}, 132));
  CHECK_THROWS(cuda::FewChannelWgrad({1, 8, 8, 1, 136, 3, 3, 1, 1}, false, 132));
  // The gate stages a second dY-sized band: a 256-pixel row of 128 channels fits alone, not twice.
  CHECK(cuda::few_channel_conv_why_not({1, 8, 256, 1, 128, 3, 3, 1, 1}) == "");
  CHECK_FALSE(cuda::few_channel_wgrad_gate_fits({1, 8, 256, 1, 128, 3, 3, 1, 1}));
  CHECK(cuda::few_channel_wgrad_gate_fits({64, 28, 28, 1, 64, 3, 3, 1, 1}));
}
