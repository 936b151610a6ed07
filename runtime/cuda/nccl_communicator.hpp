#pragma once
// One NCCL communicator of a data-parallel run (issue 25), RAII: made with
// ncclCommInitRankConfig; aborted (ncclCommAbort) when setup fails or NCCL
// reports an asynchronous error, finalised and destroyed otherwise. Every
// status is checked: a failure is a CudaError naming the call and NCCL's
// reason.
//
// Blocking mode (the default) issues each collective on the calling thread:
// NCCL's documented CUDA-graph capture path. Setup then waits for every rank
// without a timeout: a rank that dies before it is ended by whoever started
// the ranks (the --gpus supervisor, torchrun, mpirun). Non-blocking mode
// bounds setup and every enqueue by `timeout` (abort and throw), but NCCL then
// launches a group's kernels from a helper thread; whether that captures as
// reliably is what tests/cuda_backend/test_data_parallel_gpu.cpp checks.
//
// A rank's peer watchdog (runtime/distributed/peer_watchdog.hpp) reads the
// asynchronous error from its own thread and aborts the communicator when a
// peer dies, which releases NCCL kernels stuck in a graph replay. Every use
// of the handle that may race that thread takes `mutex_`; the destructor
// first drops the watchdog's registration (waiting for a check in progress),
// so the thread never sees a communicator being destroyed.
#include <nccl.h>

#include <chrono>
#include <mutex>
#include <optional>
#include <string>

#include "graph/dtype.hpp"
#include "ops/cuda/cuda_check.hpp"
#include "runtime/distributed/peer_watchdog.hpp"

namespace sg::cuda {

void check_nccl(ncclResult_t status, const char* call, const char* file, int line);
#define SG_NCCL_CHECK(call) ::sg::cuda::check_nccl((call), #call, __FILE__, __LINE__)

// NCCL's element type of a floating dtype the collectives move; nullopt for the others.
inline std::optional<ncclDataType_t> nccl_data_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return ncclFloat32;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    default: return std::nullopt;
  }
}

// A fresh ncclUniqueId as bytes (rank 0 makes it; the rendezvous hands it out).
std::string new_nccl_unique_id();
// "2.28.9": the NCCL library this process runs.
std::string nccl_version_string();

// How the collectives run (the config's data_parallel.nccl_ctas and
// data_parallel.symmetric_memory, docs/data_parallel.md).
struct NcclTuning {
  int ctas = 0;                   // CTAs per collective, fixed (ncclConfig_t minCTAs = maxCTAs); 0: NCCL's choice
  bool symmetric_memory = false;  // the training program's arena in a registered window (nccl_window.hpp)
};

class NcclCommunicator final : public distributed::WatchedCollective {
 public:
  // Joins the communicator of `world_size` ranks named by `unique_id` as
  // `rank`, on the current CUDA device. Throws (after aborting) when not
  // every rank joins within `timeout`.
  NcclCommunicator(const std::string& unique_id, int rank, int world_size, std::chrono::milliseconds timeout,
                   bool nonblocking = false, NcclTuning tuning = {});
  ~NcclCommunicator();
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  ncclComm_t get() const { return comm_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  bool nonblocking() const { return nonblocking_; }
  // True when the arenas go to NCCL symmetric memory: asked for, two or more
  // ranks (one rank copies), and an NCCL with windows (>= 2.27) built and run.
  bool symmetric_memory() const { return symmetric_memory_; }
  bool aborted() const;
  // After a call that may return ncclInProgress (non-blocking mode): waits
  // until NCCL has taken it; throws after aborting on an error or a timeout.
  // In blocking mode: checks NCCL's asynchronous error once.
  void wait_ready(const char* what) const;
  // Throws after aborting if NCCL reported an asynchronous error (a peer died).
  void check_async() const;

  // Lets the rank's peer watchdog check this communicator's asynchronous
  // error and abort it (once) when the rank must end; until destruction.
  void watched_by(distributed::PeerWatchdog& watchdog);
  // distributed::WatchedCollective, called from the watchdog's thread.
  std::string collective_name() const override { return "NCCL"; }
  std::optional<std::string> async_error() override;
  void abort() override;

 private:
  [[noreturn]] void abort_and_throw(const std::string& why) const;
  struct AsyncState {
    bool aborted = false;           // aborted already (by either thread): nothing to read
    ncclResult_t call = ncclSuccess;  // ncclCommGetAsyncError's own status
    ncclResult_t state = ncclSuccess;
    std::string last_error;         // ncclGetLastError when `state` is an error
  };
  AsyncState async_state() const;  // under the lock

  mutable std::mutex mutex_;  // comm_'s abort and status reads: the main thread and the watchdog's
  mutable ncclComm_t comm_ = nullptr;
  int rank_ = 0;
  int world_size_ = 1;
  std::chrono::milliseconds timeout_;
  bool nonblocking_ = false;
  bool symmetric_memory_ = false;
  mutable bool aborted_ = false;
  distributed::PeerWatchdog::Watch watch_;  // released first in the destructor
};

}  // namespace sg::cuda
