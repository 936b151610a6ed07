#pragma once
// RAII owners for CUDA handles: device memory, streams, events, graphs.
// Move-only; destructors never throw (errors there are only logged to stderr).
#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

namespace sg::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);  // cudaMalloc; 0 bytes -> null
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  std::size_t bytes() const { return bytes_; }

  void upload(const void* host, std::size_t bytes, std::size_t offset = 0);   // synchronous
  void download(void* host, std::size_t bytes, std::size_t offset = 0) const;  // synchronous
  void fill_bytes(int byte_value);                                          // cudaMemset, synchronous

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

class Stream {
 public:
  Stream();  // non-blocking stream
  ~Stream();
  Stream(Stream&& other) noexcept : s_(std::exchange(other.s_, nullptr)) {}
  Stream& operator=(Stream&&) = delete;
  Stream(const Stream&) = delete;
  cudaStream_t get() const { return s_; }
  void synchronize() const;

 private:
  cudaStream_t s_ = nullptr;
};

class Event {
 public:
  Event();  // timing enabled
  ~Event();
  Event(Event&& other) noexcept : e_(std::exchange(other.e_, nullptr)) {}
  Event& operator=(Event&&) = delete;
  Event(const Event&) = delete;
  cudaEvent_t get() const { return e_; }
  void record(cudaStream_t stream) const;
  void synchronize() const;
  // Milliseconds between two recorded events (both must have completed).
  static float elapsed_ms(const Event& start, const Event& stop);

 private:
  cudaEvent_t e_ = nullptr;
};

class Graph {
 public:
  Graph() = default;
  explicit Graph(cudaGraph_t g) : g_(g) {}
  ~Graph();
  Graph(Graph&& other) noexcept : g_(std::exchange(other.g_, nullptr)) {}
  Graph& operator=(Graph&& other) noexcept;
  Graph(const Graph&) = delete;
  cudaGraph_t get() const { return g_; }

 private:
  cudaGraph_t g_ = nullptr;
};

class GraphExec {
 public:
  GraphExec() = default;
  explicit GraphExec(const Graph& graph);  // cudaGraphInstantiate
  ~GraphExec();
  GraphExec(GraphExec&& other) noexcept : e_(std::exchange(other.e_, nullptr)) {}
  GraphExec& operator=(GraphExec&& other) noexcept;
  GraphExec(const GraphExec&) = delete;
  cudaGraphExec_t get() const { return e_; }
  void launch(cudaStream_t stream) const;

 private:
  cudaGraphExec_t e_ = nullptr;
};

// Begins capture on `stream` in constructor-free style: call begin(), record
// work on the stream, then end() returns the captured graph.
void begin_capture(cudaStream_t stream);
Graph end_capture(cudaStream_t stream);

}  // namespace sg::cuda
