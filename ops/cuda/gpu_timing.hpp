#pragma once
// GPU time of a few launches, without the host's time to enqueue them: the
// start-up choices (cuDNN engines, cuBLASLt algorithms, our convolutions
// against cuDNN) pick what a replayed CUDA graph runs fastest, and a graph
// replay has no host cost per launch. Timed as events around runs queued
// behind a busy-wait, so the GPU reaches the start event only when every run
// is already queued; timed without it, a run that is quick on the GPU but
// slow to enqueue (cuDNN's host work is 5-15 us a call) measured as slow.
#include <cuda_runtime.h>

#include <functional>

namespace sg::cuda {

// Keeps the GPU busy for about `microseconds` on `stream`, so that work the
// host enqueues meanwhile runs back to back.
void enqueue_busy_wait(cudaStream_t stream, double microseconds);

// Microseconds per run: `repeats` timings of `runs` runs of `run` (which
// enqueues one run on the stream it is given) back to back on `stream`, all
// queued behind one busy-wait long enough for the host to enqueue them
// (`enqueue_us` a run); their median. `run` may throw (a CudaError): the
// stream is synchronised before the error goes on.
float gpu_time_us(cudaStream_t stream, int runs, int repeats, const std::function<void(cudaStream_t)>& run,
                  double enqueue_us = 40.0);

}  // namespace sg::cuda
