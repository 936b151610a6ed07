#include "runtime/cuda/scalar_uploader.hpp"

#include <cstdio>
#include <cstring>

#include "ops/cuda/cuda_check.hpp"

namespace sg::cuda {

ScalarUploader::ScalarUploader(std::size_t bytes, std::size_t slots) : bytes_(bytes), used_(slots, false) {
  SG_CUDA_CHECK(cudaMallocHost(&pinned_, bytes * slots));
  copied_.reserve(slots);
  for (std::size_t i = 0; i < slots; ++i) copied_.emplace_back();
}

ScalarUploader::~ScalarUploader() {
  if (pinned_ && cudaFreeHost(pinned_) != cudaSuccess) std::fprintf(stderr, "warning: cudaFreeHost failed\n");
}

void ScalarUploader::upload(void* dst, const void* src, cudaStream_t stream) {
  const std::size_t slot = next_;
  next_ = (next_ + 1) % used_.size();
  if (used_[slot]) copied_[slot].synchronize();  // the copy that last read this slot has run
  char* staging = static_cast<char*>(pinned_) + slot * bytes_;
  std::memcpy(staging, src, bytes_);
  SG_CUDA_CHECK(cudaMemcpyAsync(dst, staging, bytes_, cudaMemcpyHostToDevice, stream));
  copied_[slot].record(stream);
  used_[slot] = true;
}

}  // namespace sg::cuda
