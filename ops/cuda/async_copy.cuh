#pragma once
// Asynchronous global -> shared copies (cp.async, sm_80+) and split cluster
// barriers (sm_90), as PTX: the pieces kernels use to overlap memory traffic
// and barrier latency with work.
#include <cstdint>

namespace sg::cuda {

// 16 bytes from global memory into shared memory (shared-space address), bypassing L1.
__device__ __forceinline__ void copy_async16(std::uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
// 4 bytes from global memory into shared memory (shared-space address), for sources not 16-byte aligned.
__device__ __forceinline__ void copy_async4(std::uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most `Pending` of this thread's commit groups are in flight.
template <int Pending>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
}

// A cluster barrier in two halves: arrive publishes this thread's earlier
// writes (shared memory of other blocks included) to the cluster; wait
// returns once every thread of the cluster has arrived and makes their
// writes visible. Work between the two overlaps the barrier's latency.
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory"); }

}  // namespace sg::cuda
