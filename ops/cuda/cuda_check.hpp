#pragma once
// Status checks for CUDA runtime and cuBLASLt calls. Every failure becomes a
// CudaError whose message names the call, the status and the source line.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace sg::cuda {

struct CudaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void check_cuda(cudaError_t status, const char* call, const char* file, int line);
void check_cublas(cublasStatus_t status, const char* call, const char* file, int line);
// Checks cudaGetLastError() after a kernel launch; `kernel` names it.
void check_launch(const char* kernel, const char* file, int line);

// True when at least one CUDA device is usable (false on CPU-only machines).
bool device_available();

// An attribute of the current device (cudaDeviceGetAttribute).
int current_device_attribute(cudaDeviceAttr attribute);
// Streaming multiprocessors of the current device.
int multiprocessor_count();

}  // namespace sg::cuda

// The one macro: it captures the call's text and location for the message.
#define SG_CUDA_CHECK(call) ::sg::cuda::check_cuda((call), #call, __FILE__, __LINE__)
#define SG_CUBLAS_CHECK(call) ::sg::cuda::check_cublas((call), #call, __FILE__, __LINE__)
#define SG_LAUNCH_CHECK(kernel) ::sg::cuda::check_launch(kernel, __FILE__, __LINE__)
