#pragma once
// Uploads small host values (optimizer scalars) to device memory in stream
// order without stalling: a ring of pinned staging slots, each reused only
// after the copy that last read it has run. A learning-rate change thus
// lands between two graph replays with no synchronisation and no re-capture.
#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "ops/cuda/cuda_resources.hpp"

namespace sg::cuda {

class ScalarUploader {
 public:
  ScalarUploader(std::size_t bytes, std::size_t slots = 64);
  ~ScalarUploader();
  ScalarUploader(const ScalarUploader&) = delete;
  ScalarUploader& operator=(const ScalarUploader&) = delete;

  // Copies `bytes` from host `src` to device `dst` on `stream`.
  void upload(void* dst, const void* src, cudaStream_t stream);

 private:
  std::size_t bytes_;
  void* pinned_ = nullptr;
  std::vector<Event> copied_;
  std::vector<bool> used_;
  std::size_t next_ = 0;
};

}  // namespace sg::cuda
