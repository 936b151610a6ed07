#include "ops/cuda/cuda_resources.hpp"

#include <cstdio>

#include "ops/cuda/cuda_check.hpp"

namespace sg::cuda {
namespace {

// Destructors must not throw: report and carry on.
void warn_if_failed(cudaError_t status, const char* what) {
  if (status != cudaSuccess) std::fprintf(stderr, "warning: %s failed: %s\n", what, cudaGetErrorString(status));
}

}  // namespace

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes) SG_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) warn_if_failed(cudaFree(ptr_), "cudaFree");
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (ptr_) warn_if_failed(cudaFree(ptr_), "cudaFree");
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::upload(const void* host, std::size_t bytes, std::size_t offset) {
  if (offset + bytes > bytes_) throw CudaError("DeviceBuffer::upload past the end of the buffer");
  SG_CUDA_CHECK(cudaMemcpy(static_cast<char*>(ptr_) + offset, host, bytes, cudaMemcpyHostToDevice));
  // From pageable memory cudaMemcpy may return before the DMA has landed, and
  // kernels on our non-blocking streams do not wait for the default stream:
  // an epoch's new permutation could be read half-written. Wait for it.
  SG_CUDA_CHECK(cudaStreamSynchronize(nullptr));
}

void DeviceBuffer::download(void* host, std::size_t bytes, std::size_t offset) const {
  if (offset + bytes > bytes_) throw CudaError("DeviceBuffer::download past the end of the buffer");
  SG_CUDA_CHECK(cudaMemcpy(host, static_cast<const char*>(ptr_) + offset, bytes, cudaMemcpyDeviceToHost));
}

void DeviceBuffer::fill_bytes(int byte_value) {
  if (bytes_) {
    SG_CUDA_CHECK(cudaMemset(ptr_, byte_value, bytes_));
    SG_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // (asynchronous on device memory; see upload)
  }
}

Stream::Stream() { SG_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
Stream::~Stream() {
  if (s_) warn_if_failed(cudaStreamDestroy(s_), "cudaStreamDestroy");
}
void Stream::synchronize() const { SG_CUDA_CHECK(cudaStreamSynchronize(s_)); }

Event::Event() { SG_CUDA_CHECK(cudaEventCreate(&e_)); }
Event::~Event() {
  if (e_) warn_if_failed(cudaEventDestroy(e_), "cudaEventDestroy");
}
void Event::record(cudaStream_t stream) const { SG_CUDA_CHECK(cudaEventRecord(e_, stream)); }
void Event::synchronize() const { SG_CUDA_CHECK(cudaEventSynchronize(e_)); }
float Event::elapsed_ms(const Event& start, const Event& stop) {
  float ms = 0;
  SG_CUDA_CHECK(cudaEventElapsedTime(&ms, start.e_, stop.e_));
  return ms;
}

Graph::~Graph() {
  if (g_) warn_if_failed(cudaGraphDestroy(g_), "cudaGraphDestroy");
}
Graph& Graph::operator=(Graph&& other) noexcept {
  if (this != &other) {
    if (g_) warn_if_failed(cudaGraphDestroy(g_), "cudaGraphDestroy");
    g_ = std::exchange(other.g_, nullptr);
  }
  return *this;
}

// Node priorities: a kernel captured from a stream keeps the stream's priority
// (a step's communication and gradient streams: runtime/cuda/cuda_program.cpp);
// without this flag a replay runs every node at its launch stream's.
GraphExec::GraphExec(const Graph& graph) {
  SG_CUDA_CHECK(cudaGraphInstantiate(&e_, graph.get(), cudaGraphInstantiateFlagUseNodePriority));
}
GraphExec::~GraphExec() {
  if (e_) warn_if_failed(cudaGraphExecDestroy(e_), "cudaGraphExecDestroy");
}
GraphExec& GraphExec::operator=(GraphExec&& other) noexcept {
  if (this != &other) {
    if (e_) warn_if_failed(cudaGraphExecDestroy(e_), "cudaGraphExecDestroy");
    e_ = std::exchange(other.e_, nullptr);
  }
  return *this;
}
void GraphExec::launch(cudaStream_t stream) const { SG_CUDA_CHECK(cudaGraphLaunch(e_, stream)); }

void begin_capture(cudaStream_t stream) {
  SG_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
}

Graph end_capture(cudaStream_t stream) {
  cudaGraph_t g = nullptr;
  SG_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
  return Graph(g);
}

}  // namespace sg::cuda
