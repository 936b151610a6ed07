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
                                   std::chrono::milliseconds timeout, bool nonblocking)
    : rank_(rank), world_size_(world_size), timeout_(timeout), nonblocking_(nonblocking) {
  ncclUniqueId id;
  if (unique_id.size() != sizeof id.internal)
    throw CudaError(fmt::format("NCCL unique id has {} bytes, expected {}", unique_id.size(), sizeof id.internal));
  std::memcpy(id.internal, unique_id.data(), sizeof id.internal);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = nonblocking ? 0 : 1;
  const ncclResult_t status = ncclCommInitRankConfig(&comm_, world_size, id, rank, &config);
  if (status != ncclSuccess && status != ncclInProgress) {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    check_nccl(status, "ncclCommInitRankConfig", __FILE__, __LINE__);
  }
  wait_ready("ncclCommInitRankConfig (every rank must join)");
}

NcclCommunicator::~NcclCommunicator() {
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

void NcclCommunicator::abort_and_throw(const std::string& why) const {
  if (comm_ && !aborted_) ncclCommAbort(comm_);
  aborted_ = true;
  throw CudaError(why);
}

void NcclCommunicator::wait_ready(const char* what) const {
  if (aborted_) throw CudaError(fmt::format("{}: the NCCL communicator was aborted earlier", what));
  const auto deadline = Clock::now() + timeout_;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm_, &state);
    if (rc != ncclSuccess) abort_and_throw(fmt::format("{}: ncclCommGetAsyncError failed: {}", what, ncclGetErrorString(rc)));
    if (state == ncclSuccess) return;
    if (state != ncclInProgress)
      abort_and_throw(fmt::format("{} failed on rank {} of {}: {} ({})", what, rank_, world_size_,
                                  ncclGetErrorString(state), ncclGetLastError(comm_)));
    if (Clock::now() >= deadline)
      abort_and_throw(fmt::format("{} did not complete on rank {} of {} within {}: a rank died or never came", what,
                                  rank_, world_size_, seconds(timeout_)));
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void NcclCommunicator::check_async() const {
  if (aborted_) throw CudaError("the NCCL communicator was aborted earlier");
  ncclResult_t state = ncclSuccess;
  SG_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
  if (state != ncclSuccess && state != ncclInProgress)
    abort_and_throw(fmt::format("NCCL reported an error on rank {} of {}: {} ({})", rank_, world_size_,
                                ncclGetErrorString(state), ncclGetLastError(comm_)));
}

}  // namespace sg::cuda
