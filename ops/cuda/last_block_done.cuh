#pragma once
// "Am I the last block of this launch?" for kernels that finish with one
// block's epilogue (the multi-tensor update's step advance, the clip norm's
// sum of partials): no second launch.
namespace sg::cuda {

// The last block to arrive (in any order) returns true; the counter is reset
// for the next launch. Every block's earlier reads and writes are done.
__device__ __forceinline__ bool last_block_done(unsigned* finished) {
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(finished, 1u) == gridDim.x - 1;
    if (last) *finished = 0;
  }
  __syncthreads();
  return last;
}

}  // namespace sg::cuda
