#pragma once
// One graph on the GPU (the generic cover, fast paths on) and on the CPU
// reference (f64) with the same random inputs, every marked output compared
// by relative error; the arena poisoned first, so an unwritten element shows
// as NaN. Shared by the GPU op tests.
#include <doctest/doctest.h>

#include <functional>
#include <random>
#include <vector>

#include "ops/cuda/cuda_check.hpp"
#include "runtime/cpu/cpu_executor.hpp"
#include "runtime/cuda/cuda_program.hpp"
#include "runtime/tensor_blob.hpp"
#include "tests/runtime/test_support.hpp"

namespace sg::test {

inline std::vector<float> download_value(const cuda::CudaProgram& p, const Value& v) {
  io::TensorBlob blob{v.name, v.dtype, v.shape,
                      std::string(static_cast<std::size_t>(element_count(v.shape)) * dtype_size(v.dtype), '\0')};
  SG_CUDA_CHECK(cudaDeviceSynchronize());
  SG_CUDA_CHECK(cudaMemcpy(blob.bytes.data(), p.device_ptr(v.id), blob.bytes.size(), cudaMemcpyDeviceToHost));
  return floats_from_blob(blob);
}

// Floating inputs U(lo, hi) rounded to their dtype; integer labels in
// [0, classes); the step counter = `step`. `inspect` sees the program (its
// schedule) before the comparison.
inline void check_gpu_matches_cpu(const Graph& g, std::mt19937_64& rng, double tolerance, double lo, double hi,
                                  std::int64_t classes = 2, std::int32_t step = 0,
                                  const std::function<void(const cuda::CudaProgram&)>& inspect = {}) {
  cuda::Stream stream;
  cuda::LtHandle lt;
  cuda::DeviceValues params;
  cuda::CudaProgram program(g, params, lt, {}, stream.get());
  if (inspect) inspect(program);
  CpuExecutor<double> cpu(g);
  for (const auto& v : g.values()) {
    if (v.role != Role::input && v.role != Role::label && v.role != Role::state) continue;
    if (v.dtype == DType::i32) {
      std::vector<std::int32_t> ints(static_cast<std::size_t>(element_count(v.shape)));
      for (auto& x : ints) x = v.role == Role::state ? step : static_cast<std::int32_t>(rng() % classes);
      cpu.tensor(v.id).i32 = ints;
      program.owned(v.name).upload(ints.data(), ints.size() * sizeof(std::int32_t));
      continue;
    }
    std::vector<float> host(static_cast<std::size_t>(element_count(v.shape)));
    fill_uniform(host, rng, lo, hi);
    auto blob = blob_from_floats(v.name, v.shape, v.dtype, host);
    host = floats_from_blob(blob);  // what the GPU sees (rounded to its dtype)
    program.owned(v.name).upload(blob.bytes.data(), blob.bytes.size());
    cpu.tensor(v.id).real.assign(host.begin(), host.end());
  }
  program.poison_arena(stream.get());
  program.record(stream.get());
  stream.synchronize();
  cpu.run();
  for (ValueId out : g.outputs()) {
    INFO("output " << g.value(out).name);
    CHECK(relative_error(download_value(program, g.value(out)), cpu.tensor(out).real) < tolerance);
  }
}

}  // namespace sg::test
