#pragma once
// Device memory in one NCCL symmetric-memory window (NCCL >= 2.27), RAII:
// ncclMemAlloc, then ncclCommWindowRegister(NCCL_WIN_COLL_SYMMETRIC); the
// destructor deregisters (unless the communicator was aborted: a dead peer
// cannot take part) and frees. A training program's arena lives here in a
// data-parallel run of two or more ranks (CudaProgram::bind_values). Every
// rank builds the same memory plan, so a gradient sits at the same offset of
// every rank's window, which is what NCCL's symmetric kernels need: they read
// and write the peers' buffers over NVLink directly instead of staging
// through NCCL's own (2 H200s, in a captured graph, f16: a 2.1 MB all-reduce
// in 13 us instead of 28, 5.8 MB in 25 instead of 38; docs/data_parallel.md).
//
// Registration is collective: every rank constructs its window at the same
// point (the training program's construction). The symmetric kernels take
// ncclSum, not ncclAvg (runtime/cuda/lowerings/nccl_all_reduce.cpp).
#include <nccl.h>

#include <cstddef>

#include "runtime/cuda/cuda_program.hpp"
#include "runtime/cuda/nccl_communicator.hpp"

namespace sg::cuda {

class NcclWindowBuffer {
 public:
  NcclWindowBuffer(const NcclCommunicator& communicator, std::size_t bytes);
  ~NcclWindowBuffer();
  NcclWindowBuffer(const NcclWindowBuffer&) = delete;
  NcclWindowBuffer& operator=(const NcclWindowBuffer&) = delete;

  void* data() const { return ptr_; }

 private:
  const NcclCommunicator& communicator_;
  void* ptr_ = nullptr;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
  ncclWindow_t window_ = nullptr;
#endif
};

// When `communicator` uses symmetric memory: the program's arena in a window
// of it (options.arena_memory) and each bucket one span of the arena
// (options.contiguous_buckets). Every rank calls it for the same program.
void put_arena_in_window(ProgramOptions& options, const NcclCommunicator& communicator);

}  // namespace sg::cuda
