// The channels-last channel sums and layout copies (ops/cuda/channels_last.hpp)
// called directly on device buffers. The sums add in another order than
// the reference: f32 within 1e-5 by norm of a double sum, f16 / bf16 the
// double sum rounded (or its neighbour where f32 rounding can cross a
// boundary), the same bits on a second run; sum_sgd the host SGD step on
// the sum's own gradient, bit for bit. The NCHW <-> NHWC copy: every bit,
// both directions, odd sizes.
#include "tests/kernels/channels_last_test_support.hpp"

using namespace sg;
using namespace sg::test::channels_last;

namespace {

// rows x channels: the MNIST CNNs' 128x14x14 x 64 and 128x28x28 x 32, odd
// channel counts and row counts, one row, one channel, 512 channels (several
// channel groups), and more rows than 1024 slices of the usual size (the
// slices' cap: longer slices).
const std::vector<std::pair<std::int64_t, std::int64_t>> kSumShapes = {
    {25088, 64}, {100352, 32}, {7, 13},  {25088, 13}, {1, 1},  {1, 512},    {3000, 512}, {333, 3},
    {7, 1},      {25088, 1},   {100, 8}, {5000, 24},  {1, 13}, {9000, 100}, {17000, 512}};

// The double sums of x's columns and of their magnitudes.
void column_sums(const std::vector<float>& x, std::int64_t channels, std::vector<double>& sums,
                 std::vector<double>& magnitudes) {
  sums.assign(static_cast<std::size_t>(channels), 0.0);
  magnitudes = sums;
  for (std::size_t i = 0; i < x.size(); ++i) {
    sums[i % channels] += x[i];
    magnitudes[i % channels] += std::fabs(x[i]);
  }
}

}  // namespace

TEST_CASE("ChannelsLastSum matches a double sum, the same bits on a second run, the cast to f32 folded in") {
  auto rng = sg::test::fresh_rng();
  CAPTURE(sg::test::last_seed());
  for_each_type([&](auto tag) {
    using T = decltype(tag);
    for (const auto& [rows, channels] : kSumShapes)
      for (const std::size_t offset : {std::size_t(0), std::size_t(1)}) {
        CAPTURE(fmt::format("{} rows {} channels {} offset {}", type_name<T>(), rows, channels, offset));
        std::vector<float> x(static_cast<std::size_t>(rows * channels));
        sg::test::fill_uniform(x, rng, -0.5, 1.0);  // column sums up to ~100352 / 4: within f16's range
        for (float& v : x) v = round_to<T>(v);
        std::vector<double> want, magnitude;
        column_sums(x, channels, want, magnitude);
        const cuda::ChannelsLastSum sum(rows, channels);
        const Tensor<T> d_x(x, offset);
        const auto run = [&] {
          const Tensor<T> sums(static_cast<std::size_t>(channels));  // poisoned
          sum.sum(d_x.get(), sums.get(), nullptr);
          return sums.download();
        };
        const std::vector<float> got = run();
        CHECK(bit_difference(run(), got) == "");
        if constexpr (std::is_same_v<T, float>) {
          CHECK(sg::test::relative_error(got, want) < 1e-5);
        } else {
          // got is the f32 sum rounded to T; the f32 sum lies within a few
          // f32 roundings of the double one, far less than T's rounding.
          for (std::int64_t ch = 0; ch < channels; ++ch) {
            const double s = want[ch], d = 4e-6 * magnitude[ch];
            const float g = got[ch];
            CHECK_MESSAGE(
                (g == round_to<T>(float(s)) || g == round_to<T>(float(s - d)) || g == round_to<T>(float(s + d))),
                fmt::format("channel {}: {}, expected {}", ch, g, s));
          }
          const Tensor<float> as_f32(static_cast<std::size_t>(channels));
          sum.sum(d_x.get(), as_f32.get(), nullptr);
          CHECK(bit_difference(as_f32.download(), got) == "");
        }
      }
  });
}

namespace {

// sum_sgd<W, G> on x against the host step (sgd_step.cuh's fused
// multiply-adds, in f32) from the gradient sum<G, G> gives on the same x.
template <typename W, typename G>
void check_sum_sgd(std::int64_t rows, std::int64_t channels, bool momentum, std::mt19937_64& rng) {
  CAPTURE(fmt::format("bias {} grad {} rows {} channels {} momentum {}", type_name<W>(), type_name<G>(), rows, channels,
                      momentum));
  std::vector<float> x(static_cast<std::size_t>(rows * channels)), bias(static_cast<std::size_t>(channels)),
      velocity(bias.size());
  sg::test::fill_uniform(x, rng, -0.5, 1.0);
  for (float& v : x) v = round_to<G>(v);
  sg::test::fill_uniform(bias, rng, -1.0, 1.0);
  sg::test::fill_uniform(velocity, rng, -1.0, 1.0);
  for (float& v : bias) v = round_to<W>(v);
  for (float& v : velocity) v = round_to<W>(v);
  const cuda::UpdateScalars scalars = cuda::make_update_scalars(0.05f, momentum ? 0.9f : 0.f, 1e-3f);
  cuda::DeviceBuffer d_scalars(sizeof scalars);
  d_scalars.upload(&scalars, sizeof scalars);

  const cuda::ChannelsLastSum sum(rows, channels);
  const Tensor<G> d_x(x, 0), grads(bias.size());
  sum.sum(d_x.get(), grads.get(), nullptr);
  const std::vector<float> grad = grads.download();
  const Tensor<W> d_bias(bias, 0), d_velocity(velocity, 0);
  sum.sum_sgd(d_x.get(), d_bias.get(), momentum ? d_velocity.get() : static_cast<W*>(nullptr),
              d_scalars.as<cuda::UpdateScalars>(), nullptr);
  std::vector<float> want_bias(bias.size()), want_velocity = velocity;
  for (std::size_t ch = 0; ch < bias.size(); ++ch) {
    const float g = std::fmaf(scalars.weight_decay, bias[ch], grad[ch]);
    if (momentum) {
      want_velocity[ch] = std::fmaf(scalars.momentum, velocity[ch], g);
      want_bias[ch] = round_to<W>(std::fmaf(-scalars.lr, want_velocity[ch], bias[ch]));
      want_velocity[ch] = round_to<W>(want_velocity[ch]);
    } else {
      want_bias[ch] = round_to<W>(std::fmaf(-scalars.lr, g, bias[ch]));
    }
  }
  CHECK(bit_difference(d_bias.download(), want_bias) == "");
  CHECK(bit_difference(d_velocity.download(), want_velocity) == "");  // untouched without momentum
}

}  // namespace

TEST_CASE("ChannelsLastSum::sum_sgd applies the SGD step to the sum's gradient bit for bit") {
  auto rng = sg::test::fresh_rng();
  CAPTURE(sg::test::last_seed());
  for (const auto& [rows, channels] :
       std::vector<std::pair<std::int64_t, std::int64_t>>{{25088, 64}, {7, 13}, {100352, 32}, {1, 512}, {3000, 3}})
    for (const bool momentum : {false, true}) {
      check_sum_sgd<float, float>(rows, channels, momentum, rng);
      check_sum_sgd<__half, __half>(rows, channels, momentum, rng);
      check_sum_sgd<__nv_bfloat16, __nv_bfloat16>(rows, channels, momentum, rng);
      check_sum_sgd<float, __half>(rows, channels, momentum, rng);
      check_sum_sgd<float, __nv_bfloat16>(rows, channels, momentum, rng);
    }
}

TEST_CASE("launch_channels_permute copies every bit both ways on odd sizes") {
  auto rng = sg::test::fresh_rng();
  CAPTURE(sg::test::last_seed());
  const std::vector<std::array<std::int64_t, 3>> shapes = {{3, 13, 25}, {2, 3, 784}, {1, 64, 196}, {5, 1, 49},
                                                           {2, 7, 1},   {1, 33, 33}, {2, 100, 37}, {1, 32, 32},
                                                           {4, 65, 31}, {128, 3, 9}, {1, 1, 1}};
  for_each_type([&](auto tag) {
    using T = decltype(tag);
    // Random bits (NaN payloads included), moved as raw words on the host.
    using Bits = std::conditional_t<sizeof(T) == 2, std::uint16_t, std::uint32_t>;
    for (const auto& [n, c, hw] : shapes)
      for (const bool to_channels_last : {true, false}) {
        CAPTURE(fmt::format("{} n {} c {} hw {} to_channels_last {}", type_name<T>(), n, c, hw, to_channels_last));
        const std::size_t count = static_cast<std::size_t>(n * c * hw), bytes = count * sizeof(Bits);
        std::vector<Bits> x(count);
        for (Bits& b : x) b = static_cast<Bits>(rng());
        // to channels-last, x is [n, c, hw]; back, [n, hw, c].
        const std::vector<Bits> want = to_channels_last ? transposed(x, n, c, hw) : transposed(x, n, hw, c);
        cuda::DeviceBuffer d_x(bytes), d_y(bytes), d_back(bytes);
        d_x.upload(x.data(), bytes);
        cuda::launch_poison(d_y.data(), bytes, nullptr);
        cuda::launch_channels_permute(d_x.as<T>(), n, c, hw, to_channels_last, d_y.as<T>(), nullptr);
        cuda::launch_channels_permute(d_y.as<T>(), n, c, hw, !to_channels_last, d_back.as<T>(), nullptr);
        SG_CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<Bits> got(count), back(count);
        d_y.download(got.data(), bytes);
        d_back.download(back.data(), bytes);
        CHECK(got == want);
        CHECK(back == x);
      }
  });
}
