// The late producer of late_producer.hpp.
#include <cstdint>

#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/cuda_resources.hpp"
#include "ops/cuda/dependent_launch.cuh"
#include "tests/support/late_producer.hpp"

namespace sg::test {
namespace {

__global__ void late_copy_kernel(unsigned char* target, const unsigned char* source, std::size_t bytes,
                                 long long delay_ns) {
  cuda::allow_next_kernel_to_start();
  std::uint64_t start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < std::uint64_t(delay_ns));
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < bytes;
       i += std::size_t(gridDim.x) * blockDim.x)
    target[i] = source[i];
}

}  // namespace

void launch_late_copy(void* target, const void* source, std::size_t bytes, double delay_us, cudaStream_t stream) {
  late_copy_kernel<<<8, 256, 0, stream>>>(static_cast<unsigned char*>(target),
                                          static_cast<const unsigned char*>(source), bytes,
                                          static_cast<long long>(delay_us * 1000.0));
  SG_LAUNCH_CHECK("late_copy_kernel");
}

void run_behind_late_copy(void* target, const void* source, std::size_t bytes,
                          const std::function<void(cudaStream_t)>& consumer, bool as_graph) {
  const cuda::Stream stream;
  constexpr double kDelayUs = 200.0;  // far longer than any consumer's launch and first loads
  if (!as_graph) {
    launch_late_copy(target, source, bytes, kDelayUs, stream.get());
    consumer(stream.get());
  } else {
    cuda::begin_capture(stream.get());
    launch_late_copy(target, source, bytes, kDelayUs, stream.get());
    consumer(stream.get());
    const cuda::Graph graph = cuda::end_capture(stream.get());
    const cuda::GraphExec exec(graph);
    exec.launch(stream.get());
  }
  stream.synchronize();
}

}  // namespace sg::test
