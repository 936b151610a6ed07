#pragma once
// Test helper for dependent launches (ops/cuda/dependent_launch.cuh): a
// producer kernel that lets the next kernel start at once, then spins for
// `delay_us` before it copies `bytes` from `source` to `target`. A dependent
// kernel that read `target` before waiting for its producer would see what
// was there before (poison), so a missing or misplaced wait shows.
#include <cuda_runtime.h>

#include <cstddef>
#include <functional>

namespace sg::test {

void launch_late_copy(void* target, const void* source, std::size_t bytes, double delay_us, cudaStream_t stream);

// Runs `consumer(stream)` right behind a late copy of `bytes` from `source`
// to `target`, on a stream or as one captured and replayed CUDA graph; waits.
void run_behind_late_copy(void* target, const void* source, std::size_t bytes,
                          const std::function<void(cudaStream_t)>& consumer, bool as_graph);

}  // namespace sg::test
