// The conv bias gradient's channel sums (ops/cuda/channel_sum.cu) on the
// plane sizes that pick each of its read paths: whole planes a slice read in
// 16-byte packs (28x28, 4x4 in f16; 14x14 in f32), 8-byte (14x14 in f16),
// 4-byte (3x2 in f16) or element by element (7x7, 1x1, 5x7), and planes
// larger than a slice cut into segments (70x70, 128x128; 65x67 odd); batch
// sizes that are multiples of nothing; the MNIST CNNs' 128x32x28x28 and
// 128x64x14x14; and random shapes. Through the CUDA program against the CPU
// reference, alone and with the cast to f32 and the SGD update folded in; and
// the kernel called directly on x offset from its allocation's alignment
// (narrower packs), against a double-precision sum. Sums in another order than the reference:
// a relative error by norm, and the same bits on a second run.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <random>
#include <string>
#include <vector>

#include "ops/cuda/channel_sum.hpp"
#include "ops/cuda/cuda_resources.hpp"
#include "runtime/tensor_blob.hpp"
#include "tests/kernels/twin_run.hpp"
#include "tests/runtime/test_support.hpp"
#include "tests/support/core_only_skips.hpp"

using namespace sg;
using sg::test::Fill;
using sg::test::pick;
using sg::test::TwinRun;
using sg::test::with_type;

namespace {

const std::vector<DType> kDtypes = {DType::f32, DType::f16, DType::bf16};

const std::vector<Shape> kShapes = {{37, 6, 28, 28}, {131, 4, 14, 14}, {67, 9, 7, 7},     {129, 17, 1, 1},
                                    {13, 3, 5, 7},   {3, 2, 70, 70},   {5, 3, 65, 67},    {2, 2, 128, 128},
                                    {1, 1, 1, 1},    {7, 5, 3, 2},     {11, 3, 2, 2},     {9, 3, 4, 4},
                                    {1, 3, 70, 70},  {128, 32, 28, 28}, {128, 64, 14, 14}};

// f32: the reference adds up to ~63000 terms one by one in float, the GPU in
// a tree: both carry ~sqrt(terms) * 2^-24 of rounding. f16 / bf16: the two
// sums may round to neighbouring values.
double sum_tolerance(DType dtype) { return dtype == DType::f32 ? 1e-4 : dtype == DType::f16 ? 2e-3 : 1e-2; }

// channel_sum of x [shape] of dtype [+ the cast to f32] through the CUDA
// program (one channel_sum launch) against the CPU reference. The slices of
// a channel finish in any order; the partials add in a fixed order and the
// finished counters reset for the next launch: a rerun gives the same bits.
void check_channel_sum(const Shape& shape, DType dtype, bool cast, std::mt19937_64& rng) {
  CAPTURE(sg::test::last_seed());
  CAPTURE(fmt::format("{} {} cast {}", dtype_name(dtype), fmt::join(shape, "x"), cast));
  Graph g;
  const ValueId x = g.input("x", shape, dtype);
  ValueId sum = g.append_node(OpKind::channel_sum, {x}, NoAttrs{}).front();
  if (cast) sum = g.append_node(OpKind::cast, {sum}, CastAttrs{DType::f32}).front();
  g.mark_output(sum);
  TwinRun run(std::move(g), rng, Fill{false, 0.0, 1.0});  // positive: no cancellation in the reference sum
  CHECK(run.lowerings() == std::vector<std::string>{"channel_sum"});
  const auto first = run.gpu(sum);
  run.rerun();
  CHECK(run.gpu(sum) == first);
  CHECK(run.error(sum) < sum_tolerance(dtype));
}

}  // namespace

TEST_CASE("channel_sum [+ cast] on planes of every read path matches the CPU reference, the same bits every run") {
  auto rng = sg::test::fresh_rng();
  for (const Shape& shape : kShapes)
    for (const DType dtype : kDtypes)
      for (const bool cast : {false, true}) {
        if (cast && dtype == DType::f32) continue;
        check_channel_sum(shape, dtype, cast, rng);
      }
}

TEST_CASE("channel_sum alone, and with the cast to f32 after it, matches the CPU reference") {
  auto rng = sg::test::fresh_rng();
  for (const DType dtype : kDtypes)
    for (int trial = 0; trial < 4; ++trial) {
      const Shape shape{pick(rng, 1, 70), pick(rng, 1, 40), pick(rng, 1, 30), pick(rng, 1, 30)};
      const bool cast = dtype != DType::f32 && trial % 2 == 1;  // an fp32 master bias's gradient
      check_channel_sum(shape, dtype, cast, rng);
    }
}

TEST_CASE("channel_sum + sgd_update on planes of every read path matches the CPU reference") {
  SG_SKIP_IF_CORE_ONLY("fused_update's channel_sum_sgd");
  auto rng = sg::test::fresh_rng();
  const std::vector<std::pair<DType, DType>> types = {
      {DType::f32, DType::f32}, {DType::f16, DType::f32}, {DType::bf16, DType::f32}, {DType::f16, DType::f16}};
  for (const Shape& shape : kShapes)
    for (const auto& [grad_type, bias_type] : types) {
      CAPTURE(sg::test::last_seed());
      CAPTURE(fmt::format("grad {} bias {} dy {}", dtype_name(grad_type), dtype_name(bias_type),
                          fmt::join(shape, "x")));
      Graph g;
      const ValueId dy = g.input("dy", shape, grad_type);
      const ValueId bias = g.param("b", {shape[1]}, bias_type);
      const ValueId velocity = g.state("vel_b", {shape[1]}, bias_type);
      ValueId grad = g.append_node(OpKind::channel_sum, {dy}, NoAttrs{}).front();
      if (grad_type != bias_type) grad = g.append_node(OpKind::cast, {grad}, CastAttrs{bias_type}).front();
      g.sgd_update(bias, grad, 0.5, 1e-3, velocity);
      TwinRun run(std::move(g), rng, Fill{false, 0.0, 1.0}, 0, 0.01);
      CHECK(run.lowerings() == std::vector<std::string>{"channel_sum_sgd"});
      // One ulp of the gradient's dtype at most, carried into the update (test_cnn_kernels.cpp).
      CHECK(run.error(bias) < sum_tolerance(grad_type));
      CHECK(run.error(velocity) < sum_tolerance(grad_type));
    }
}

TEST_CASE("channel_sum on x offset from its alignment (narrower packs) matches a double sum, the same bits every run") {
  auto rng = sg::test::fresh_rng();
  cuda::Stream stream;
  for (const Shape& shape : {Shape{37, 6, 28, 28}, Shape{19, 5, 4, 4}, Shape{3, 2, 70, 70}, Shape{131, 4, 14, 14}})
    for (const DType dtype : kDtypes) {
      const std::int64_t n = shape[0], channels = shape[1], plane = shape[2] * shape[3];
      const std::int64_t count = n * channels * plane;
      const std::size_t e = dtype_size(dtype);
      std::vector<float> host(static_cast<std::size_t>(count));
      sg::test::fill_uniform(host, rng, 0.0, 1.0);
      const auto blob = blob_from_floats("x", shape, dtype, host);
      host = floats_from_blob(blob);  // as the GPU holds them
      std::vector<double> expected(static_cast<std::size_t>(channels), 0.0);
      for (std::int64_t i = 0; i < count; ++i) expected[static_cast<std::size_t>(i / plane % channels)] += host[i];
      const cuda::ChannelSum kernel(n, channels, plane);
      for (const std::size_t offset : {std::size_t(0), e, 2 * e, 4 * e}) {
        CAPTURE(sg::test::last_seed());
        CAPTURE(fmt::format("{} {} offset {}", dtype_name(dtype), fmt::join(shape, "x"), offset));
        cuda::DeviceBuffer x(blob.bytes.size() + offset), sums(std::size_t(channels) * sizeof(float));
        x.upload(blob.bytes.data(), blob.bytes.size(), offset);
        const void* at = static_cast<const char*>(x.data()) + offset;
        const auto run = [&] {
          sums.fill_bytes(0xff);
          with_type(dtype, [&](auto tag) {
            using T = decltype(tag);
            kernel.sum(static_cast<const T*>(at), sums.as<float>(), stream.get());
          });
          stream.synchronize();
          std::vector<float> got(static_cast<std::size_t>(channels));
          sums.download(got.data(), got.size() * sizeof(float));
          return got;
        };
        const auto got = run();
        CHECK(run() == got);
        CHECK(sg::test::relative_error(got, expected) < sum_tolerance(dtype));
      }
    }
}
