#include "ops/cuda/gpu_timing.hpp"

#include <algorithm>
#include <vector>

#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/cuda_resources.hpp"

namespace sg::cuda {
namespace {

__global__ void busy_wait_kernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

}  // namespace

void enqueue_busy_wait(cudaStream_t stream, double microseconds) {
  int device = 0, khz = 0;
  SG_CUDA_CHECK(cudaGetDevice(&device));
  SG_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device));
  busy_wait_kernel<<<1, 1, 0, stream>>>(static_cast<long long>(microseconds * khz / 1e3));
  SG_LAUNCH_CHECK("busy_wait_kernel");
}

float gpu_time_us(cudaStream_t stream, int runs, int repeats, const std::function<void(cudaStream_t)>& run,
                  double enqueue_us) {
  std::vector<Event> marks(static_cast<std::size_t>(repeats) + 1);  // timing r runs from mark r to mark r + 1
  enqueue_busy_wait(stream, 20.0 + enqueue_us * runs * repeats);
  try {
    marks[0].record(stream);
    for (int r = 0; r < repeats; ++r) {
      for (int i = 0; i < runs; ++i) run(stream);
      marks[r + 1].record(stream);
    }
  } catch (...) {
    SG_CUDA_CHECK(cudaStreamSynchronize(stream));
    throw;
  }
  marks.back().synchronize();
  std::vector<float> times;
  for (int r = 0; r < repeats; ++r)
    times.push_back(Event::elapsed_ms(marks[r], marks[r + 1]) * 1000.0f / static_cast<float>(runs));
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

}  // namespace sg::cuda
