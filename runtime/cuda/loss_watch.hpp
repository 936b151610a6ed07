#pragma once
// NaN/Inf watch for the training loss: a one-thread kernel enqueued after
// every training launch (outside the captured graphs, so their node counts
// and timings are unchanged) records, in device memory, the step after the
// first launch whose last loss is not finite. Read it when the host syncs.
#include <cstdint>

#include <cuda_runtime.h>

namespace sg::cuda {

// if (*first_bad < 0 && !isfinite(*loss)) *first_bad = step
void enqueue_loss_watch(const float* loss, long long* first_bad, std::int64_t step, cudaStream_t stream);

}  // namespace sg::cuda
