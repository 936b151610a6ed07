// A new element-wise op (gelu, gelu_backward) reaches the GPU through the
// op registry, its CUDA kernel and the element-wise lowering's kernel table,
// with no edit to the scheduler: a graph using it is covered, recorded and
// run, and matches the CPU reference on random shapes (poisoned outputs).
#include <doctest/doctest.h>

#include <cuda_fp16.h>

#include "ops/cuda/cuda_check.hpp"
#include "runtime/cpu/cpu_executor.hpp"
#include "runtime/cuda/cuda_program.hpp"
#include "runtime/tensor_blob.hpp"
#include "tests/runtime/test_support.hpp"

using namespace sg;

namespace {

std::vector<float> download(const cuda::CudaProgram& p, const Value& v) {
  io::TensorBlob blob{v.name, v.dtype, v.shape, std::string(static_cast<std::size_t>(element_count(v.shape)) * dtype_size(v.dtype), '\0')};
  SG_CUDA_CHECK(cudaDeviceSynchronize());
  SG_CUDA_CHECK(cudaMemcpy(blob.bytes.data(), p.device_ptr(v.id), blob.bytes.size(), cudaMemcpyDeviceToHost));
  return floats_from_blob(blob);
}

}  // namespace

TEST_CASE("gelu and its gradient run on the GPU through the generic cover and match the CPU reference") {
  auto rng = sg::test::fresh_rng();
  for (const DType dtype : {DType::f32, DType::f16}) {
    const std::int64_t rows = 1 + std::int64_t(rng() % 37), cols = 1 + std::int64_t(rng() % 301);
    INFO(dtype_name(dtype) << " [" << rows << "," << cols << "], seed " << sg::test::last_seed());
    Graph g;
    const ValueId x = g.input("x", {rows, cols}, dtype);
    const ValueId dy = g.input("dy", {rows, cols}, dtype);
    const ValueId y = g.gelu(x);
    const ValueId dx = g.gelu_backward(dy, x);
    g.mark_output(y);
    g.mark_output(dx);

    cuda::Stream stream;
    cuda::LtHandle lt;
    cuda::DeviceValues params;
    cuda::CudaProgram program(g, params, lt, {}, stream.get());
    REQUIRE(program.schedule().launches.size() == 2);
    for (const Launch& l : program.schedule().launches) CHECK(l.lowering->name() == "elementwise");

    std::vector<float> hx(static_cast<std::size_t>(rows * cols)), hdy(hx.size());
    sg::test::fill_uniform(hx, rng, -4.0, 4.0);
    sg::test::fill_uniform(hdy, rng, -1.0, 1.0);
    for (const auto& [id, host] : {std::pair{x, &hx}, std::pair{dy, &hdy}}) {
      const Value& v = g.value(id);
      auto blob = blob_from_floats(v.name, v.shape, v.dtype, *host);
      *host = floats_from_blob(blob);  // what the GPU sees (fp16-rounded)
      program.owned(v.name).upload(blob.bytes.data(), blob.bytes.size());
    }
    program.poison_arena(stream.get());
    program.record(stream.get());
    stream.synchronize();

    CpuExecutor<double> cpu(g);
    for (std::size_t i = 0; i < hx.size(); ++i) {
      cpu.tensor(x).real[i] = hx[i];
      cpu.tensor(dy).real[i] = hdy[i];
    }
    cpu.run();
    const double tol = dtype == DType::f16 ? 2e-3 : 1e-5;
    CHECK(sg::test::relative_error(download(program, g.value(y)), cpu.tensor(y).real) < tol);
    CHECK(sg::test::relative_error(download(program, g.value(dx)), cpu.tensor(dx).real) < tol);
  }
}
