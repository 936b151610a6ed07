// precision.compute (fp16 | bf16): the config key, its errors, the shipped
// bf16 config, the program it builds, and bf16 tensors in checkpoints.
#include <doctest/doctest.h>

#include <zlib.h>

#include <cstring>
#include <random>

#include "apps/backend_choice.hpp"
#include "apps/config/train_config.hpp"
#include "apps/training_run.hpp"
#include "runtime/half_width_floats.hpp"
#include "runtime/io/atomic_file.hpp"
#include "runtime/io/checkpoint.hpp"
#include "runtime/tensor_blob.hpp"
#include "tests/support/temp_files.hpp"
#include "tests/support/test_data.hpp"

using namespace sg;
using namespace sg::app;

namespace {

doctest::String error_of(const std::string& yaml) {
  try {
    parse_config(yaml, "test.yaml", {});
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

const std::string kMinimal = "model:\n  layers: [784, 64, 10]\nrun:\n  steps: 10\n";

}  // namespace

TEST_CASE("precision.compute: fp16 by default, bf16 on request, and clear errors") {
  CHECK(parse_config(kMinimal, "test.yaml", {}).precision.compute == "fp16");
  const auto bf16 = parse_config(kMinimal + "precision:\n  compute: bf16\n  weights: fp32\n", "test.yaml", {});
  CHECK(bf16.precision.compute == "bf16");
  CHECK(to_yaml(bf16).find("compute: bf16") != std::string::npos);  // the resolved config keeps it
  const auto low = parse_config(kMinimal + "precision:\n  compute: bf16\n  weights: bf16\n", "test.yaml", {});
  CHECK(low.precision.weights == "bf16");
  CHECK(error_of(kMinimal + "precision:\n  compute: fp8\n") == doctest::Contains("precision.compute"));
  CHECK(error_of(kMinimal + "precision:\n  compute: bf16\n") ==
        doctest::Contains("precision.weights: low-precision weights are stored in the compute dtype"));
  CHECK(error_of(kMinimal + "precision:\n  compute: fp16\n  weights: bf16\n") ==
        doctest::Contains("use weights: fp16 or fp32"));
  CHECK(error_of(kMinimal + "precision:\n  compute: bf16\n  weights: bf16\n  accumulate: fp16\n") ==
        doctest::Contains("precision.accumulate: cuBLASLt accumulates bf16 matmuls in fp32 only"));
}

TEST_CASE("precision.all_reduce: fp32 by default, compute on request (the optimizer's flag), and clear errors") {
  const auto plain = parse_config(kMinimal, "test.yaml", {});
  CHECK(plain.precision.all_reduce == "fp32");
  CHECK_FALSE(mlp_training(plain).optimizer.reduce_in_compute_dtype);
  const auto compute = parse_config(kMinimal + "precision:\n  weights: fp32\n  all_reduce: compute\n", "test.yaml", {});
  CHECK(compute.precision.all_reduce == "compute");
  CHECK(mlp_training(compute).optimizer.reduce_in_compute_dtype);
  CHECK(to_yaml(compute).find("all_reduce: compute") != std::string::npos);  // the resolved config keeps it
  CHECK(error_of(kMinimal + "precision:\n  all_reduce: fp16\n") == doctest::Contains("precision.all_reduce"));
}

TEST_CASE("configs/mnist_bf16.yaml is the default MLP with bf16 compute and builds a bf16 program") {
  const auto c = load_config(sg::test::source_dir() / "configs/mnist_bf16.yaml");
  const auto mlp = load_config(sg::test::source_dir() / "configs/mnist_mlp.yaml");
  CHECK(c.precision.compute == "bf16");
  CHECK(c.precision.weights == "fp32");
  CHECK(c.model.layers == mlp.model.layers);
  CHECK(c.data.batch_size == mlp.data.batch_size);
  const MlpTraining t = mlp_training(c);
  CHECK(t.mlp.compute_dtype == DType::bf16);
  CHECK(t.mlp.weight_dtype == DType::f32);
  for (const ProgramTarget target : {ProgramTarget::cpu, ProgramTarget::cuda}) {
    const TrainingProgram p = build_mlp_program(t, 600, 100, target);
    int bf16_values = 0;
    for (const Value& v : p.train.values()) bf16_values += v.dtype == DType::bf16;
    CHECK(bf16_values > 10);
    for (const Value& v : p.train.values()) CHECK(v.dtype != DType::f16);  // nothing is left in fp16
  }
  // Low-precision weights follow the compute dtype.
  const auto low = parse_config(kMinimal + "precision:\n  compute: bf16\n  weights: bf16\n", "test.yaml", {});
  CHECK(mlp_training(low).mlp.weight_dtype == DType::bf16);
}

TEST_CASE("bf16 tensors round-trip through checkpoints, an unknown dtype code is a clear IoError") {
  const auto dir = sg::test::fresh_dir("ckpt-bf16");
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> uniform(-3.f, 3.f);
  std::vector<float> values(33);
  for (float& v : values) v = uniform(rng);
  const io::TensorBlob blob = blob_from_floats("w", {3, 11}, DType::bf16, values);
  CHECK(blob.bytes.size() == 66);
  const std::vector<float> back = floats_from_blob(blob);
  for (std::size_t i = 0; i < values.size(); ++i) CHECK(back[i] == round_to_bf16(values[i]));
  CHECK(blob_from_floats("w", {3, 11}, DType::bf16, back) == blob);  // representable values are kept bit for bit

  io::Checkpoint c;
  c.step = 7;
  c.tensors = {blob};
  const auto path = dir / "model.sgck";
  io::save_checkpoint(path, c);
  const io::Checkpoint loaded = io::load_checkpoint(path);
  CHECK(loaded == c);
  CHECK(loaded.tensors[0].dtype == DType::bf16);

  // The dtype byte follows magic, version, step, seed, config (length only), count and the name.
  std::string bytes = io::read_file(path);
  const std::size_t dtype_at = 8 + 4 + 8 + 8 + 8 + 4 + 8 + 1;
  REQUIRE(static_cast<std::uint8_t>(bytes[dtype_at]) == static_cast<std::uint8_t>(DType::bf16));
  bytes[dtype_at] = 5;  // one past the last code
  const auto crc = static_cast<std::uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size() - 4)));
  std::memcpy(bytes.data() + bytes.size() - 4, &crc, 4);
  sg::test::write_file(path, bytes);
  CHECK_THROWS_WITH_AS(io::load_checkpoint(path), doctest::Contains("tensor 'w' has unknown dtype code 5"), io::IoError);
  std::filesystem::remove_all(dir);
}

TEST_CASE("precision.compute: bf16 trains on the CPU backend, resumes bit-exactly, and a resume may not change it") {
  namespace fs = std::filesystem;
  const auto out = sg::test::fresh_dir("bf16-run");
  const auto config = [&](const std::string& dir, std::vector<std::string> extra) {
    extra.push_back("data.dir=" + sg::test::mnist_dir_or_skip().string());
    extra.push_back("run.out_dir=" + (out / dir).string());
    extra.push_back("precision.compute=bf16");
    extra.push_back("precision.weights=bf16");
    extra.push_back("optim.momentum=0.9");
    return load_config(sg::test::source_dir() / "configs/ci_small.yaml", extra);
  };
  const auto a = run_training(config("a", {"run.steps=200", "run.checkpoint=" + (out / "a.sgck").string()}));
  run_training(config("b", {"run.steps=100", "run.checkpoint=" + (out / "b.sgck").string()}));
  run_training(config("c", {"run.steps=200", "run.resume=" + (out / "b.sgck").string(),
                            "run.checkpoint=" + (out / "c.sgck").string()}));
  MESSAGE("bf16 compute and weights, 200 steps of configs/ci_small.yaml: test accuracy " << a.final_eval.accuracy);
  CHECK(a.final_eval.accuracy > 0.8);
  const auto straight = io::load_checkpoint(out / "a.sgck");
  const auto resumed = io::load_checkpoint(out / "c.sgck");
  REQUIRE(straight.tensors.size() == resumed.tensors.size());
  for (std::size_t i = 0; i < straight.tensors.size(); ++i) {
    INFO(straight.tensors[i].name);
    CHECK(straight.tensors[i] == resumed.tensors[i]);
    // The CPU backend stores bf16 weights as floats; each is a bf16 value.
    if (straight.tensors[i].dtype == DType::f32)
      for (float v : floats_from_blob(straight.tensors[i])) CHECK(v == round_to_bf16(v));
  }
  CHECK(io::read_file(out / "a" / "config.yaml").find("compute: bf16") != std::string::npos);
  // Resuming in fp16 would change the trajectory: refused, naming the key
  // (fp32 master weights in both runs, so the compute dtype is all that differs).
  run_training(config("e", {"precision.weights=fp32", "run.steps=20", "run.checkpoint=" + (out / "e.sgck").string()}));
  auto fp16 = config("f", {"precision.weights=fp32", "run.steps=40", "run.resume=" + (out / "e.sgck").string()});
  fp16.precision.compute = "fp16";
  CHECK_THROWS_WITH_AS(run_training(fp16), doctest::Contains("precision.compute is fp16 here but bf16"), ConfigError);
  fs::remove_all(out);
}
