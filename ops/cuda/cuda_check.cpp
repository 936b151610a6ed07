#include "ops/cuda/cuda_check.hpp"

#include <fmt/format.h>

namespace sg::cuda {

void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  throw CudaError(fmt::format("{} failed: {}: {} at {}:{}", call, cudaGetErrorName(status), cudaGetErrorString(status),
                              file, line));
}

void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw CudaError(fmt::format("{} failed: {}: {} at {}:{}", call, cublasLtGetStatusName(status),
                              cublasLtGetStatusString(status), file, line));
}

void check_launch(const char* kernel, const char* file, int line) {
  const cudaError_t status = cudaGetLastError();
  if (status == cudaSuccess) return;
  throw CudaError(fmt::format("launch of {} failed: {}: {} at {}:{}", kernel, cudaGetErrorName(status),
                              cudaGetErrorString(status), file, line));
}

bool device_available() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  return count > 0;
}

int current_device_attribute(cudaDeviceAttr attribute) {
  int device = 0, value = 0;
  SG_CUDA_CHECK(cudaGetDevice(&device));
  SG_CUDA_CHECK(cudaDeviceGetAttribute(&value, attribute, device));
  return value;
}

int multiprocessor_count() { return current_device_attribute(cudaDevAttrMultiProcessorCount); }

}  // namespace sg::cuda
