#include "runtime/cuda/nccl_window.hpp"

#include <cstdio>

namespace sg::cuda {

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)

NcclWindowBuffer::NcclWindowBuffer(const NcclCommunicator& communicator, std::size_t bytes)
    : communicator_(communicator) {
  if (!communicator.symmetric_memory())
    throw CudaError("NcclWindowBuffer: this communicator does not use symmetric memory");
  if (bytes == 0) return;
  SG_NCCL_CHECK(ncclMemAlloc(&ptr_, bytes));
  const ncclResult_t status =
      ncclCommWindowRegister(communicator.get(), ptr_, bytes, &window_, NCCL_WIN_COLL_SYMMETRIC);
  if (status != ncclSuccess && status != ncclInProgress) {
    ncclMemFree(ptr_);
    check_nccl(status, "ncclCommWindowRegister", __FILE__, __LINE__);
  }
  try {
    communicator.wait_ready("ncclCommWindowRegister (every rank registers its arena)");
  } catch (...) {
    ncclMemFree(ptr_);  // the communicator is aborted: nothing to deregister from
    throw;
  }
}

NcclWindowBuffer::~NcclWindowBuffer() {
  if (!ptr_) return;
  if (window_ && !communicator_.aborted()) {
    const ncclResult_t status = ncclCommWindowDeregister(communicator_.get(), window_);
    if (status != ncclSuccess && status != ncclInProgress)
      std::fprintf(stderr, "stepgraph: ncclCommWindowDeregister failed: %s\n", ncclGetErrorString(status));
  }
  if (const ncclResult_t status = ncclMemFree(ptr_); status != ncclSuccess)
    std::fprintf(stderr, "stepgraph: ncclMemFree failed: %s\n", ncclGetErrorString(status));
}

#else

NcclWindowBuffer::NcclWindowBuffer(const NcclCommunicator& communicator, std::size_t /*bytes*/)
    : communicator_(communicator) {
  throw CudaError("NcclWindowBuffer: symmetric memory needs NCCL 2.27 or later at build time");
}

NcclWindowBuffer::~NcclWindowBuffer() = default;

#endif

void put_arena_in_window(ProgramOptions& options, const NcclCommunicator& communicator) {
  if (!communicator.symmetric_memory()) return;
  options.arena_memory = [comm = &communicator](std::size_t bytes) -> std::shared_ptr<void> {
    auto window = std::make_shared<NcclWindowBuffer>(*comm, bytes);
    return {window, window->data()};
  };
  options.contiguous_buckets = true;
}

}  // namespace sg::cuda
