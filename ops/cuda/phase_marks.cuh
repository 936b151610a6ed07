#pragma once
// Profiling marks of the whole-network kernels (whole_step, resident_step,
// cnn_step: their `phase_clock` argument): thread 0 of block 0 stores the GPU's
// global clock (ns) at clock[k], so the host can name the gaps between marks.
// One copy, so every kernel's marks read the same clock the same way.
namespace sg::cuda {

// Stores the clock at clock[k] when `clock` is set and `when` holds (e.g. the
// first step or example only); callers sit right after a barrier.
__device__ __forceinline__ void mark_phase(unsigned long long* clock, int k, bool when = true) {
  if (clock && when && blockIdx.x == 0 && threadIdx.x == 0) {
    unsigned long long ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    clock[k] = ns;
  }
}

}  // namespace sg::cuda
