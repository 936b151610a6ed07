#pragma once
// Hopper asynchronous copies between global and shared memory (TMA bulk
// tensor copies and plain bulk copies, sm_90) and the mbarriers that count
// their bytes, as the one-pass batch-256 backward (dgrad_wgrad_wgmma.cu) and
// the resident-filter convolution (fast_paths/tensor_core_conv/
// conv_nhwc_resident.cu) use them. Tensor maps come from tensor_map.hpp;
// their tiles are 128-byte swizzled rows of 64 halves.
#include <cuda.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "ops/cuda/mma_fragments.cuh"  // shared_address

namespace sg::cuda::tma {

// ---- mbarriers (one 64-bit word of shared memory each) ----
__device__ __forceinline__ void barrier_init(std::uint64_t* barrier, unsigned arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(barrier)), "r"(arrivals));
}
// Makes the initialised barriers visible to the copy engine.
__device__ __forceinline__ void barrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void arrive(std::uint64_t* barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(barrier)) : "memory");
}
// Arrives and tells the barrier `bytes` more are coming from copies.
__device__ __forceinline__ void arrive_expect_bytes(std::uint64_t* barrier, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(barrier)), "r"(bytes)
               : "memory");
}
// Arrives on the barrier at the same shared-memory offset in block `cta_rank`
// of this cluster, as the local arrive does (release, CTA scope).
__device__ __forceinline__ void arrive_in_block(std::uint64_t* barrier, unsigned cta_rank) {
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(shared_address(barrier)),
      "r"(cta_rank)
      : "memory");
}
// This block's rank in its cluster.
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return rank;
}
// Waits for the phase with this parity (0, 1, 0, ... for uses 0, 1, 2, ...) to complete.
__device__ __forceinline__ void wait(std::uint64_t* barrier, unsigned parity) {
  std::uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(shared_address(barrier)), "r"(parity)
        : "memory");
  } while (!done);
}

// ---- copies ----
// Global -> shared: `bytes` contiguous bytes (a multiple of 16; both addresses 16-byte aligned), a bulk copy
// without a tensor map; completes its bytes on `barrier`.
__device__ __forceinline__ void load_bytes(void* dst, const void* src, unsigned bytes, std::uint64_t* barrier) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   shared_address(dst)),
               "l"(src), "r"(bytes), "r"(shared_address(barrier))
               : "memory");
}
// The same bytes into the same shared-memory offset of every block of the cluster in `cta_mask`; each
// copy completes its bytes on the barrier at `barrier`'s offset in its block.
__device__ __forceinline__ void load_bytes_to_blocks(void* dst, const void* src, unsigned bytes,
                                                     std::uint64_t* barrier, std::uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, [%3], "
      "%4;" ::"r"(shared_address(dst)),
      "l"(src), "r"(bytes), "r"(shared_address(barrier)), "h"(cta_mask)
      : "memory");
}
// Global -> shared: the box at (column c0, row c1) of `map`; completes bytes on `barrier`.
__device__ __forceinline__ void load_tile(const CUtensorMap* map, std::uint64_t* barrier, void* tile, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(
          shared_address(tile)),
      "l"(map), "r"(shared_address(barrier)), "r"(c0), "r"(c1)
      : "memory");
}
// The same box into the same shared-memory offset of every block of the
// cluster in `cta_mask`; each copy completes bytes on the barrier at
// `barrier`'s offset in its block.
__device__ __forceinline__ void load_tile_to_blocks(const CUtensorMap* map, std::uint64_t* barrier, void* tile, int c0,
                                                    int c1, std::uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%3, "
      "%4}], [%2], %5;" ::"r"(shared_address(tile)),
      "l"(map), "r"(shared_address(barrier)), "r"(c0), "r"(c1), "h"(cta_mask)
      : "memory");
}
// Shared -> global into the box at (c0, c1), as one bulk group of this thread.
__device__ __forceinline__ void store_tile(const CUtensorMap* map, const void* tile, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(map),
               "r"(shared_address(tile)), "r"(c0), "r"(c1)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
// This thread's stores have read their shared memory (it may be overwritten).
__device__ __forceinline__ void wait_stores_read() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
// This thread's stores are complete.
__device__ __forceinline__ void wait_stores_done() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
// Orders this thread's ordinary shared-memory writes before later copies read them.
__device__ __forceinline__ void fence_shared_for_copies() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Byte offset of element (row, col) in a tile of 64-half rows that TMA wrote
// with 128-byte swizzling (the 16-byte chunks of row r permuted by r mod 8).
__device__ __forceinline__ int swizzled_offset(int row, int col) {
  return row * 128 + ((((col >> 3) ^ row) & 7) << 4) + (col & 7) * 2;
}

// bar.sync on a named barrier for `threads` threads (a multiple of 32).
__device__ __forceinline__ void sync_threads(int barrier_id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(barrier_id), "r"(threads) : "memory");
}

}  // namespace sg::cuda::tma
