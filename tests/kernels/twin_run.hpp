#pragma once
// One graph run once on the GPU (through the CUDA program: the real cover,
// so a test also checks which lowering took each node) and once on
// CpuExecutor<float>, which rounds every f16 / bf16 value a node writes as
// the GPU stores it, from the same inputs; outputs are poisoned first (an
// unwritten element reads NaN, and NaN never passes relative_error). Shared
// by the CNN kernels' tests.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <random>
#include <string>
#include <vector>

#include "ops/cuda/cuda_check.hpp"
#include "runtime/cpu/cpu_executor.hpp"
#include "runtime/cuda/cuda_program.hpp"
#include "runtime/tensor_blob.hpp"
#include "tests/runtime/test_support.hpp"

namespace sg::test {

// The relative error by norm a GPU result of `dtype` may have against the
// CPU reference when its sums add in another order (block reductions): a
// few roundings of the type.
inline double sum_order_tolerance(DType dtype) {
  return dtype == DType::f32 ? 2e-5 : dtype == DType::f16 ? 4e-3 : 3e-2;
}

// f(T{}) with T the element type of dtype (f32, f16 or bf16): the tests that
// call a kernel directly on typed device buffers.
template <typename F>
void with_type(DType dtype, F&& f) {
  if (dtype == DType::f32)
    f(float{});
  else if (dtype == DType::f16)
    f(__half{});
  else
    f(__nv_bfloat16{});
}

// How floating inputs are drawn: U(lo, hi), or small integers (pooling
// windows full of ties, which exercise the first-maximum rule).
struct Fill {
  bool ties = false;
  double lo = -2.0, hi = 2.0;
};

// One graph run once on the GPU and on the CPU reference from the same inputs.
class TwinRun {
 public:
  TwinRun(Graph g, std::mt19937_64& rng, Fill fill, std::int32_t step = 0, double lr = 0.0)
      : cpu_(g), program_(std::move(g), params_, lt_, options(lr), stream_.get()) {
    const Graph& graph = program_.graph();
    if (lr > 0) cpu_.set_learning_rate(lr);
    for (const Value& v : graph.values()) {
      if (!is_graph_owned(v.role)) continue;
      cuda::DeviceBuffer& buffer = v.role == Role::param ? params_.at(v.name) : program_.owned(v.name);
      if (v.dtype == DType::i32) {
        const std::vector<std::int32_t> ints(static_cast<std::size_t>(element_count(v.shape)), step);
        cpu_.tensor(v.id).i32 = ints;
        buffer.upload(ints.data(), ints.size() * sizeof(std::int32_t));
        continue;
      }
      std::vector<float> host(static_cast<std::size_t>(element_count(v.shape)));
      if (fill.ties)
        for (auto& x : host) x = static_cast<float>(static_cast<int>(rng() % 5) - 2);
      else
        sg::test::fill_uniform(host, rng, fill.lo, fill.hi);
      const auto blob = blob_from_floats(v.name, v.shape, v.dtype, host);
      host = floats_from_blob(blob);  // what the GPU holds (rounded to its dtype)
      buffer.upload(blob.bytes.data(), blob.bytes.size());
      cpu_.tensor(v.id).real.assign(host.begin(), host.end());
    }
    program_.poison_arena(stream_.get());
    program_.record(stream_.get());
    stream_.synchronize();
    cpu_.run();
  }

  const Graph& graph() const { return program_.graph(); }

  // The step's launches once more on the same inputs (after poisoning the
  // arena again): for ops that only read their inputs, the same bits.
  void rerun() {
    program_.poison_arena(stream_.get());
    program_.record(stream_.get());
    stream_.synchronize();
  }

  std::vector<float> gpu(ValueId id) const {
    const Value& v = graph().value(id);
    io::TensorBlob blob{v.name, v.dtype, v.shape,
                        std::string(static_cast<std::size_t>(element_count(v.shape)) * dtype_size(v.dtype), '\0')};
    SG_CUDA_CHECK(cudaDeviceSynchronize());
    SG_CUDA_CHECK(cudaMemcpy(blob.bytes.data(), program_.device_ptr(id), blob.bytes.size(), cudaMemcpyDeviceToHost));
    return floats_from_blob(blob);
  }
  std::vector<float> cpu(ValueId id) { return cpu_.tensor(id).real; }
  std::int32_t gpu_i32(ValueId id) const {
    std::int32_t v = 0;
    SG_CUDA_CHECK(cudaDeviceSynchronize());
    SG_CUDA_CHECK(cudaMemcpy(&v, program_.device_ptr(id), sizeof v, cudaMemcpyDeviceToHost));
    return v;
  }
  std::int32_t cpu_i32(ValueId id) { return cpu_.tensor(id).i32.at(0); }
  double error(ValueId id) { return sg::test::relative_error(gpu(id), cpu(id)); }

  // The lowering of every launch, in order.
  std::vector<std::string> lowerings() const {
    std::vector<std::string> names;
    for (const Launch& l : program_.schedule().launches) names.emplace_back(l.lowering->name());
    return names;
  }

 private:
  static cuda::ProgramOptions options(double lr) {
    cuda::ProgramOptions o;
    o.learning_rate = lr;
    return o;
  }

  cuda::Stream stream_;
  cuda::LtHandle lt_;
  cuda::DeviceValues params_;
  CpuExecutor<float> cpu_;
  cuda::CudaProgram program_;
};

}  // namespace sg::test
