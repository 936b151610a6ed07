#include "runtime/cuda/loss_watch.hpp"

#include "ops/cuda/cuda_check.hpp"

namespace sg::cuda {
namespace {

__global__ void loss_watch_kernel(const float* loss, long long* first_bad, long long step) {
  if (*first_bad < 0 && !isfinite(*loss)) *first_bad = step;
}

}  // namespace

void enqueue_loss_watch(const float* loss, long long* first_bad, std::int64_t step, cudaStream_t stream) {
  loss_watch_kernel<<<1, 1, 0, stream>>>(loss, first_bad, static_cast<long long>(step));
  SG_LAUNCH_CHECK("loss_watch_kernel");
}

}  // namespace sg::cuda
