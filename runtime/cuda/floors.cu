#include "runtime/cuda/floors.hpp"

#include <algorithm>
#include <vector>

#include "ops/cuda/cublaslt_matmul.hpp"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/kernels.hpp"
#include "ops/cuda/cuda_resources.hpp"

namespace sg::cuda {
namespace {

__global__ void empty_kernel() {}

void launch_empties(int count, cudaStream_t stream) {
  for (int i = 0; i < count; ++i) empty_kernel<<<1, 1, 0, stream>>>();
  SG_LAUNCH_CHECK("empty_kernel");
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median over `repeats` of the milliseconds `work` takes on `stream`.
template <typename Work>
double time_ms(const Stream& stream, int repeats, Work&& work) {
  Event start, stop;
  std::vector<double> ms;
  work();  // warm-up
  stream.synchronize();
  for (int r = 0; r < repeats; ++r) {
    start.record(stream.get());
    work();
    stop.record(stream.get());
    stop.synchronize();
    ms.push_back(Event::elapsed_ms(start, stop));
  }
  return median(ms);
}

// The fp16 tensor-core peak as cuBLASLt reaches it: a square 8192^3 matmul.
double measure_matmul_tflops(const Stream& stream) {
  constexpr std::int64_t n = 8192;
  LtHandle lt;
  MatmulShape shape{n, n, n, false, false, ElemType::f16, ElemType::f16, Accumulate::f32, Epilogue::none};
  LtMatmul mm(lt, shape, false, stream.get());
  DeviceBuffer a(n * n * 2), b(n * n * 2), d(n * n * 2), scalars(8);
  launch_fill_uniform(a.as<__half>(), n * n, 1, -1.f, 1.f, stream.get());
  launch_fill_uniform(b.as<__half>(), n * n, 2, -1.f, 1.f, stream.get());
  const float one_zero[2] = {1.f, 0.f};
  scalars.upload(one_zero, sizeof one_zero);
  const void* alpha = scalars.as<float>();
  const void* beta = scalars.as<float>() + 1;
  const double ms = time_ms(stream, 5, [&] {
    for (int i = 0; i < 5; ++i) mm.run(a.data(), b.data(), d.data(), d.data(), alpha, beta, nullptr, nullptr, stream.get());
  }) / 5;
  return 2.0 * double(n) * n * n / (ms * 1e-3) / 1e12;
}

}  // namespace

Floors measure_floors() {
  Stream stream;
  Floors f;
  constexpr int kLaunches = 10000;
  f.empty_launch_us = 1e3 * time_ms(stream, 5, [&] { launch_empties(kLaunches, stream.get()); }) / kLaunches;

  constexpr int kNodes = 1000;
  begin_capture(stream.get());
  launch_empties(kNodes, stream.get());
  Graph graph = end_capture(stream.get());
  GraphExec exec(graph);
  f.graph_node_us = 1e3 * time_ms(stream, 5, [&] { exec.launch(stream.get()); }) / kNodes;

  constexpr std::size_t kBytes = std::size_t(1) << 30;
  DeviceBuffer src(kBytes), dst(kBytes);
  src.fill_bytes(1);
  const double ms = time_ms(stream, 5, [&] {
    SG_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), kBytes, cudaMemcpyDeviceToDevice, stream.get()));
  });
  f.copy_bandwidth_gbs = 2.0 * double(kBytes) / (ms * 1e-3) / 1e9;
  f.matmul_tflops = measure_matmul_tflops(stream);
  return f;
}

}  // namespace sg::cuda
