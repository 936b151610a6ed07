// The CPU backend stores f16 / bf16 values as the GPU does: rounded to their
// format (nearest even) after every node that writes them; f64 gradient
// checks keep the exact math.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>

#include "graph/dump.hpp"
#include "models/mlp.hpp"
#include "runtime/cpu/cpu_executor.hpp"
#include "runtime/data/idx_reader.hpp"
#include "runtime/half_width_floats.hpp"
#include "runtime/trainer.hpp"
#include "tests/support/test_data.hpp"
#include "tests/support/training_helpers.hpp"

using namespace sg;

namespace {

std::uint32_t bits_of(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

}  // namespace

TEST_CASE("bf16 rounding: nearest, ties to even, NaN stays NaN, overflow goes to infinity") {
  CHECK(float_to_bf16_bits(1.0f) == 0x3F80);
  CHECK(float_to_bf16_bits(-2.0f) == 0xC000);
  CHECK(round_to_bf16(1.0f + 0x1p-8f) == 1.0f);                 // tie: even mantissa (1.0) wins
  CHECK(round_to_bf16(1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f);   // tie: 1 + 2^-6 has the even mantissa
  CHECK(round_to_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f);  // above the tie: up
  CHECK(round_to_bf16(std::numeric_limits<float>::max()) == std::numeric_limits<float>::infinity());
  CHECK(std::isnan(round_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  const float signalling = std::numeric_limits<float>::signaling_NaN();
  CHECK(std::isnan(round_to_bf16(signalling)));                  // low mantissa bits dropped: still a NaN
  CHECK(float_to_bf16_bits(0x1p-133f) == 0x0001);               // subnormal: the smallest bf16 subnormal
  // Every bf16 value is itself after a round trip, and rounding is monotone.
  float previous = -std::numeric_limits<float>::infinity();
  for (std::uint32_t b = 0xFF80; b > 0x8000; --b) {  // negative finite values, ascending
    const float x = bf16_bits_to_float(static_cast<std::uint16_t>(b));
    CHECK(float_to_bf16_bits(x) == b);
    CHECK(round_to_bf16(x) >= previous);
    previous = x;
  }
  // Half (bit arithmetic) against the compiler's _Float16 conversion, across
  // the float range (every 251st bit pattern, both signs, NaNs, subnormals).
  std::uint64_t mismatches = 0;
  for (std::uint64_t b = 0; b <= 0xffffffffull; b += 251) {
    const auto pattern = static_cast<std::uint32_t>(b);
    float x;
    std::memcpy(&x, &pattern, sizeof x);
    const float want = static_cast<float>(static_cast<_Float16>(x));
    const float got = round_to_f16(x);
    if (std::isnan(want) ? !std::isnan(got) : bits_of(got) != bits_of(want)) {
      if (++mismatches <= 5) MESSAGE("pattern " << pattern << ": got " << got << ", _Float16 gives " << want);
    }
  }
  CHECK(mismatches == 0);
  // Ties at both ends of the half range.
  for (const float x : {0x1p-25f, 3 * 0x1p-25f, -0x1p-25f, 0x1p-14f - 0x1p-25f, 65504.0f, 65519.0f, 65520.0f, -65520.0f})
    CHECK(bits_of(round_to_f16(x)) == bits_of(static_cast<float>(static_cast<_Float16>(x))));
  // Half: 11 significant bits.
  CHECK(round_to_f16(1.0f + 0x1p-11f) == 1.0f);
  CHECK(round_to_f16(1.0f + 0x1p-10f) == 1.0f + 0x1p-10f);
  CHECK(round_to_f16(65520.0f) == std::numeric_limits<float>::infinity());
  CHECK(bits_of(round_to_dtype(0.1f, DType::f32)) == bits_of(0.1f));
}

TEST_CASE("the f32 CPU backend rounds every f16 / bf16 value a node writes, f64 keeps them exact") {
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  for (const DType low : {DType::f16, DType::bf16}) {
    CAPTURE(dtype_name(low));
    Graph g;
    const ValueId x = g.input("x", {5, 7}, DType::f32);
    const ValueId w = g.param("w", {3, 7}, low);
    const ValueId xl = g.cast(x, low);
    const ValueId y = g.matmul(xl, w, false, true);  // [5, 3] in `low`
    const ValueId y32 = g.cast(y, DType::f32);
    g.mark_output(y32);
    const ValueId dw = g.param("dw", {3, 7}, low);
    g.sgd_update(w, dw);

    CpuExecutor<float> rounded(g);
    CpuExecutor<float> exact(g, HalfWidthValues::exact);
    std::vector<float> xs(35), ws(21), dws(21);
    for (auto* v : {&xs, &ws, &dws})
      for (float& e : *v) e = uniform(rng);
    for (CpuExecutor<float>* e : {&rounded, &exact}) {
      e->tensor(x).real = xs;
      e->tensor(w).real = ws;
      e->tensor(dw).real = dws;
      e->round_to_dtype(w);  // as the trainers load low-precision parameters
      e->round_to_dtype(dw);
      e->set_learning_rate(0.25);
      e->run();
    }
    // Rounded: the cast output, the product and the in-place update each hold representable values.
    const auto& xr = rounded.tensor(xl).real;
    for (std::size_t i = 0; i < xr.size(); ++i) CHECK(xr[i] == round_to_dtype(xs[i], low));
    int inexact = 0;
    for (std::size_t i = 0; i < xr.size(); ++i) inexact += exact.tensor(xl).real[i] != xr[i];
    CHECK(inexact > 0);  // 35 random floats are not all representable: the exact run kept them
    const auto& wr = rounded.tensor(w).real;
    for (float v : wr) CHECK(v == round_to_dtype(v, low));
    const auto& yr = rounded.tensor(y).real;
    for (std::int64_t r = 0; r < 5; ++r)
      for (std::int64_t c = 0; c < 3; ++c) {
        // The product of the rounded inputs, summed in f32, then rounded once (as cuBLASLt stores it).
        float sum = 0.f;
        for (std::int64_t k = 0; k < 7; ++k)
          sum += xr[static_cast<std::size_t>(r * 7 + k)] * round_to_dtype(ws[static_cast<std::size_t>(c * 7 + k)], low);
        CHECK(yr[static_cast<std::size_t>(r * 3 + c)] == round_to_dtype(sum, low));
      }
    // f64 executors keep full precision unless asked (finite-difference checks need exact math).
    CpuExecutor<double> f64(g);
    f64.tensor(x).real.assign(35, 1.0 / 3.0);
    f64.set_learning_rate(0.25);
    f64.run();
    CHECK(f64.tensor(xl).real[0] == 1.0 / 3.0);
  }
}

TEST_CASE("bf16 compute learns 2,000 real MNIST images on the CPU, about as fp16 compute does") {
  const Dataset data{data::load_split(sg::test::mnist_dir_or_skip(), "train", 2000),
                     data::load_split(sg::test::mnist_dir_or_skip(), "t10k", 1000)};
  std::map<DType, double> accuracy;
  for (const DType compute : {DType::f16, DType::bf16}) {
    sg::test::MlpTrainerSpec spec;
    spec.mlp.layers = {784, 64, 10};
    spec.mlp.batch = 32;
    spec.mlp.compute_dtype = compute;
    spec.mlp.weight_dtype = DType::f32;
    spec.optimizer = {0.1, 0.0, 0.0};
    auto trainer = make_cpu_trainer(sg::test::cpu_spec(spec, data), data);
    trainer->train(300);
    accuracy[compute] = trainer->evaluate().accuracy;
    MESSAGE(dtype_name(compute) << " compute: test accuracy " << accuracy[compute]);
  }
  CHECK(accuracy[DType::f16] > 0.80);
  CHECK(accuracy[DType::bf16] > 0.80);
  // bf16's 8-bit mantissa costs little here: within 3 points of fp16 on 1,000 test images.
  CHECK(std::abs(accuracy[DType::bf16] - accuracy[DType::f16]) < 0.03);
}

TEST_CASE("a bf16 training graph dumps as text and round-trips through JSON") {
  MlpSpec spec;
  spec.layers = {20, 16, 4};
  spec.batch = 8;
  spec.dataset_rows = 64;
  spec.compute_dtype = DType::bf16;
  spec.weight_dtype = DType::f32;
  const Graph g = build_training_stages(spec, {0.1, 0.9, 0.0}).fused;
  const std::string text = dump_text(g);
  CHECK(text.find("[8,20]bf16") != std::string::npos);  // the fetched batch
  const std::string json = dump_json(g);
  CHECK(json.find("\"bf16\"") != std::string::npos);
  const Graph back = graph_from_json(json);
  CHECK(dump_json(back) == json);
  int bf16_values = 0;
  for (const Value& v : back.values()) bf16_values += v.dtype == DType::bf16;
  CHECK(bf16_values > 5);
  CHECK_THROWS_WITH_AS(dtype_from_name("bf8"), doctest::Contains("expected f32, f16, bf16, i32 or u8"),
                       std::invalid_argument);
  CHECK(dtype_from_code(4) == DType::bf16);
  CHECK_FALSE(dtype_from_code(5).has_value());
}
