#include "runtime/cuda/nccl_communicator.hpp"

#include <cstring>
#include <thread>

#include <fmt/format.h>

namespace sg::cuda {
namespace {

using Clock = std::chrono::steady_clock;

std::string seconds(std::chrono::milliseconds ms) { return fmt::format("{:g} s", double(ms.count()) / 1000.0); }

}  // namespace

void check_nccl(ncclResult_t status, const char* call, const char* file, int line) {
  if (status == ncclSuccess || status == ncclInProgress) return;  // in progress: wait_ready() follows
  throw CudaError(fmt::format("{} failed: {} ({}) at {}:{}", call, ncclGetErrorString(status), ncclGetLastError(nullptr),
                              file, line));
}

std::string new_nccl_unique_id() {
  ncclUniqueId id;
  SG_NCCL_CHECK(ncclGetUniqueId(&id));
  return std::string(id.internal, sizeof id.internal);
}

std::string nccl_version_string() {
  int v = 0;
  SG_NCCL_CHECK(ncclGetVersion(&v));
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

NcclCommunicator::NcclCommunicator(const std::string& unique_id, int rank, int world_size,
                                   std::chrono::milliseconds timeout, bool nonblocking, NcclTuning tuning)
    : rank_(rank), world_size_(world_size), timeout_(timeout), nonblocking_(nonblocking) {
  ncclUniqueId id;
  if (unique_id.size() != sizeof id.internal)
    throw CudaError(fmt::format("NCCL unique id has {} bytes, expected {}", unique_id.size(), sizeof id.internal));
  std::memcpy(id.internal, unique_id.data(), sizeof id.internal);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = nonblocking ? 0 : 1;
  if (tuning.ctas > 0) config.minCTAs = config.maxCTAs = tuning.ctas;
  const ncclResult_t status = ncclCommInitRankConfig(&comm_, world_size, id, rank, &config);
  if (status != ncclSuccess && status != ncclInProgress) {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    check_nccl(status, "ncclCommInitRankConfig", __FILE__, __LINE__);
  }
  wait_ready("ncclCommInitRankConfig (every rank must join)");
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
  int version = 0;
  SG_NCCL_CHECK(ncclGetVersion(&version));
  symmetric_memory_ = tuning.symmetric_memory && world_size > 1 && version >= NCCL_VERSION(2, 27, 0);
#endif
}

bool NcclCommunicator::aborted() const {
  const std::lock_guard lock(mutex_);
  return aborted_;
}

NcclCommunicator::~NcclCommunicator() {
  watch_.release();  // first: from here on the watchdog's thread does not touch this communicator
  const std::lock_guard lock(mutex_);
  if (!comm_ || aborted_) return;
  // Finalize flushes this rank's outstanding work; a peer that is gone keeps
  // it in progress (non-blocking mode), so after the timeout the communicator
  // is aborted instead.
  ncclResult_t state = ncclSuccess;
  if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
    ncclCommAbort(comm_);  // NCCL reported an error: nothing left to flush
    return;
  }
  state = ncclCommFinalize(comm_);
  const auto deadline = Clock::now() + timeout_;
  while (state == ncclInProgress && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) break;
  }
  if (state == ncclSuccess) ncclCommDestroy(comm_);
  else ncclCommAbort(comm_);
}

NcclCommunicator::AsyncState NcclCommunicator::async_state() const {
  const std::lock_guard lock(mutex_);
  AsyncState s;
  if (aborted_ || !comm_) {
    s.aborted = true;
    return s;
  }
  s.call = ncclCommGetAsyncError(comm_, &s.state);
  if (s.call == ncclSuccess && s.state != ncclSuccess && s.state != ncclInProgress) s.last_error = ncclGetLastError(comm_);
  return s;
}

void NcclCommunicator::abort_and_throw(const std::string& why) const {
  {
    const std::lock_guard lock(mutex_);
    if (comm_ && !aborted_) ncclCommAbort(comm_);
    aborted_ = true;
  }
  throw CudaError(why);
}

void NcclCommunicator::wait_ready(const char* what) const {
  const auto deadline = Clock::now() + timeout_;
  for (;;) {
    const AsyncState s = async_state();
    if (s.aborted) throw CudaError(fmt::format("{}: the NCCL communicator was aborted", what));
    if (s.call != ncclSuccess)
      abort_and_throw(fmt::format("{}: ncclCommGetAsyncError failed: {}", what, ncclGetErrorString(s.call)));
    if (s.state == ncclSuccess) return;
    if (s.state != ncclInProgress)
      abort_and_throw(fmt::format("{} failed on rank {} of {}: {} ({})", what, rank_, world_size_,
                                  ncclGetErrorString(s.state), s.last_error));
    if (Clock::now() >= deadline)
      abort_and_throw(fmt::format("{} did not complete on rank {} of {} within {}: a rank died or never came", what,
                                  rank_, world_size_, seconds(timeout_)));
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void NcclCommunicator::check_async() const {
  const AsyncState s = async_state();
  if (s.aborted) throw CudaError("the NCCL communicator was aborted");
  if (s.call != ncclSuccess)
    throw CudaError(fmt::format("ncclCommGetAsyncError failed: {}", ncclGetErrorString(s.call)));
  if (s.state != ncclSuccess && s.state != ncclInProgress)
    abort_and_throw(fmt::format("NCCL reported an error on rank {} of {}: {} ({})", rank_, world_size_,
                                ncclGetErrorString(s.state), s.last_error));
}

void NcclCommunicator::watched_by(distributed::PeerWatchdog& watchdog) { watch_ = watchdog.watch(*this); }

std::optional<std::string> NcclCommunicator::async_error() {
  const AsyncState s = async_state();
  if (s.aborted) return std::nullopt;  // the main thread aborted it and reports why itself
  if (s.call != ncclSuccess) return fmt::format("ncclCommGetAsyncError failed: {}", ncclGetErrorString(s.call));
  if (s.state == ncclSuccess || s.state == ncclInProgress) return std::nullopt;
  return fmt::format("{}: {}", ncclGetErrorString(s.state), s.last_error);
}

void NcclCommunicator::abort() {
  const std::lock_guard lock(mutex_);
  if (comm_ && !aborted_) ncclCommAbort(comm_);  // releases kernels waiting for a dead peer
  aborted_ = true;
}

}  // namespace sg::cuda
