// Own data on the GPU (issue 23) against the CPU reference: the table_fetch
// lowering (f16/f32 feature tables, u8 tables without labels, f32 regression
// targets) inside training steps and inside the prediction graph. Random
// shapes; relative error by norm; NaN never passes (rel_error is infinite
// then), and every output row of the prediction is compared, so rows the
// fetch left unwritten show.
#include <doctest/doctest.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <random>

#include "graph/fusion_pass.hpp"
#include "ops/cuda/table_fetch.hpp"
#include "tests/support/device_array.hpp"
#include "models/mlp_program.hpp"
#include "runtime/cuda/cuda_prediction.hpp"
#include "runtime/cuda/cuda_trainer.hpp"
#include "runtime/prediction.hpp"
#include "runtime/tensor_blob.hpp"
#include "tests/support/training_helpers.hpp"

using namespace sg;

namespace {

double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    diff += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    norm += double(want[i]) * want[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

// A feature table of `rows` x `cols` in `dtype` (u8 pixels or normal floats).
data::ImageSet table(std::int64_t rows, std::int64_t cols, DType dtype, std::mt19937_64& rng) {
  data::ImageSet t;
  t.count = rows;
  t.rows = 1;
  t.cols = cols;
  t.dtype = dtype;
  std::normal_distribution<float> normal;
  const auto n = static_cast<std::size_t>(rows * cols);
  if (dtype == DType::u8) {
    t.pixels.resize(n);
    for (auto& p : t.pixels) p = static_cast<std::uint8_t>(rng() % 256);
  } else if (dtype == DType::f32) {
    std::vector<float> v(n);
    for (auto& x : v) x = normal(rng);
    t.pixels.resize(n * 4);
    std::memcpy(t.pixels.data(), v.data(), n * 4);
  } else {
    std::vector<std::uint16_t> v(n);
    for (auto& x : v) x = float_to_half_bits(normal(rng));
    t.pixels.resize(n * 2);
    std::memcpy(t.pixels.data(), v.data(), n * 2);
  }
  return t;
}

Dataset float_dataset(std::int64_t rows, std::int64_t cols, DType dtype, std::int64_t target_width,
                      std::int64_t classes, std::mt19937_64& rng) {
  auto split = [&](std::int64_t n) {
    data::Split s;
    s.images = table(n, cols, dtype, rng);
    if (target_width > 0) {
      std::normal_distribution<float> normal;
      s.labels.target_width = target_width;
      s.labels.targets.resize(static_cast<std::size_t>(n * target_width));
      for (auto& t : s.labels.targets) t = normal(rng);
    } else {
      s.labels.labels.resize(static_cast<std::size_t>(n));
      for (auto& l : s.labels.labels) l = static_cast<std::uint8_t>(rng() % static_cast<std::uint64_t>(classes));
      s.classes = classes;
    }
    return s;
  };
  return {split(rows), split(rows / 2)};
}

}  // namespace

TEST_CASE("predict: the GPU prediction graph equals the CPU reference for u8, f16 and f32 tables") {
  std::mt19937_64 rng(23);
  for (DType dtype : {DType::u8, DType::f16, DType::f32}) {
    for (int trial = 0; trial < 3; ++trial) {
      const std::int64_t cols = 3 + static_cast<std::int64_t>(rng() % 70), hidden = 8 + 8 * (rng() % 8);
      const std::int64_t classes = 2 + static_cast<std::int64_t>(rng() % 9), batch = 1 + static_cast<std::int64_t>(rng() % 64);
      const std::int64_t rows = batch * (1 + static_cast<std::int64_t>(rng() % 5));
      INFO(dtype_name(dtype) << " " << rows << "x" << cols << " -> " << hidden << " -> " << classes << ", batch " << batch);
      MlpSpec spec;
      spec.layers = {cols, hidden, classes};
      spec.feature_dtype = dtype;
      spec.input_scale = dtype == DType::u8 ? 1.0 / 255 : 0.7;
      spec.input_shift = -0.1;
      spec.batch = batch;
      spec.dataset_rows = rows;
      spec.compute_dtype = DType::f16;
      spec.weight_dtype = DType::f32;
      PredictionProgram p;
      p.graph = build_mlp_predict(spec);
      fuse(p.graph);
      p.features = p.graph.value_named(names::images);
      p.perm = p.graph.value_named(names::perm);
      p.step = p.graph.value_named(names::step);
      p.output = p.graph.outputs().front();
      p.batch = batch;
      std::vector<io::TensorBlob> params;
      for (const auto& init : mlp_initial_parameters(spec.layers, rng()))
        params.push_back(blob_from_floats(init.name, init.shape, DType::f32, init.values));
      const auto t = table(rows, cols, dtype, rng);
      const auto cpu = predict_on_cpu(p, params, t);
      const auto gpu = cuda::predict_on_cuda(p, params, t, BackendOptions{});
      CHECK(gpu.size() == static_cast<std::size_t>(rows * classes));
      CHECK(rel_error(gpu, cpu) < 5e-3);
    }
  }
}

TEST_CASE("training on f16/f32 features with class labels: the CUDA losses follow the CPU reference") {
  std::mt19937_64 rng(5);
  for (DType dtype : {DType::f16, DType::f32}) {
    const auto data = float_dataset(256, 37, dtype, 0, 7, rng);
    test::MlpTrainerSpec s;
    s.mlp.layers = {37, 64, 7};
    s.mlp.batch = 32;
    s.mlp.feature_dtype = dtype;
    s.mlp.input_scale = 0.5;
    s.mlp.input_shift = 0.25;
    s.mlp.weight_dtype = DType::f32;
    s.optimizer.lr = 0.05;
    s.eval_batch = 64;
    auto cpu = make_cpu_trainer(test::cpu_spec(s, data), data);
    auto gpu = cuda::make_cuda_trainer(test::cuda_spec(s, data), data);
    const auto a = test::losses(*cpu, 20), b = test::losses(*gpu, 20);
    INFO(dtype_name(dtype));
    CHECK(rel_error(b, a) < 1e-2);
    const auto ea = cpu->evaluate(), eb = gpu->evaluate();
    CHECK(eb.loss == doctest::Approx(ea.loss).epsilon(1e-2));
  }
}

TEST_CASE("training on float regression targets (mse): the CUDA losses follow the CPU reference") {
  std::mt19937_64 rng(7);
  const auto data = float_dataset(192, 19, DType::f32, 3, 0, rng);
  test::MlpTrainerSpec s;
  s.mlp.layers = {19, 32, 3};
  s.mlp.batch = 16;
  s.mlp.feature_dtype = DType::f32;
  s.mlp.input_scale = 1.0;
  s.mlp.target_width = 3;
  s.mlp.loss = MlpLoss::mse;
  s.mlp.weight_dtype = DType::f32;
  s.optimizer.lr = 0.02;
  s.eval_batch = 32;
  auto cpu = make_cpu_trainer(test::cpu_spec(s, data), data);
  auto gpu = cuda::make_cuda_trainer(test::cuda_spec(s, data), data);
  const auto a = test::losses(*cpu, 20), b = test::losses(*gpu, 20);
  CHECK(rel_error(b, a) < 1e-2);
  const auto ea = cpu->evaluate(), eb = gpu->evaluate();
  CHECK(std::isnan(eb.accuracy));
  CHECK(eb.loss == doctest::Approx(ea.loss).epsilon(1e-2));
}

namespace {

// One launch_table_fetch of a random table into a poisoned output, against
// the host gather (the CPU reference's gather_rows rule).
template <typename In, typename Out>
void check_table_fetch(std::mt19937_64& rng) {
  const std::int64_t batch = 1 + static_cast<std::int64_t>(rng() % 40), batches = 1 + static_cast<std::int64_t>(rng() % 6);
  const std::int64_t n = batch * batches + static_cast<std::int64_t>(rng() % 3);  // rows past the last whole batch
  const std::int64_t cols = 1 + static_cast<std::int64_t>(rng() % 300);
  const std::int32_t step = static_cast<std::int32_t>(rng() % 17);
  const bool labels = std::is_same_v<Out, std::int32_t>;
  const float scale = labels ? 1.f : 0.37f, shift = labels ? 0.f : -1.25f;
  INFO("n " << n << " cols " << cols << " batch " << batch << " step " << step);
  std::vector<std::int32_t> perm(static_cast<std::size_t>(n));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<float> table(static_cast<std::size_t>(n * cols));
  std::normal_distribution<float> normal;
  for (auto& v : table) v = std::is_same_v<In, std::uint8_t> ? float(rng() % 256) : normal(rng);
  table = test::representable<In>(table);
  std::vector<In> host_table(table.size());
  for (std::size_t i = 0; i < table.size(); ++i) host_table[i] = static_cast<In>(table[i]);
  cuda::DeviceBuffer d_table(host_table.size() * sizeof(In)), d_perm(perm.size() * 4), d_step(4);
  d_table.upload(host_table.data(), d_table.bytes());
  d_perm.upload(perm.data(), d_perm.bytes());
  d_step.upload(&step, 4);
  test::DeviceArray<Out> out(static_cast<std::size_t>(batch * cols));  // poisoned
  cuda::launch_table_fetch(d_perm.as<std::int32_t>(), n, d_step.as<std::int32_t>(), batch, d_table.as<In>(), cols,
                           scale, shift, out.get(), nullptr);
  const auto got = out.download();
  std::vector<float> want(got.size());
  const std::int64_t base = (step % (n / batch)) * batch;
  for (std::int64_t i = 0; i < batch; ++i)
    for (std::int64_t c = 0; c < cols; ++c)
      want[i * cols + c] = static_cast<float>(static_cast<Out>(table[perm[base + i] * cols + c] * scale + shift));
  CHECK(rel_error(got, want) <= (std::is_same_v<Out, float> || labels ? 1e-6 : 1e-2));
}

}  // namespace

TEST_CASE("table_fetch kernel: every table type into every output type, poisoned outputs fully written") {
  std::mt19937_64 rng(31);
  for (int trial = 0; trial < 4; ++trial) {
    check_table_fetch<std::uint8_t, __half>(rng);
    check_table_fetch<std::uint8_t, __nv_bfloat16>(rng);
    check_table_fetch<std::uint8_t, float>(rng);
    check_table_fetch<std::uint8_t, std::int32_t>(rng);
    check_table_fetch<__half, __half>(rng);
    check_table_fetch<__half, __nv_bfloat16>(rng);
    check_table_fetch<__half, float>(rng);
    check_table_fetch<float, __half>(rng);
    check_table_fetch<float, __nv_bfloat16>(rng);
    check_table_fetch<float, float>(rng);
  }
}
