#include "runtime/cuda/device_release.hpp"

#include <cuda_runtime.h>

namespace sg::cuda {

bool release_device() noexcept {
  if (cudaDeviceReset() == cudaSuccess) return true;
  (void)cudaGetLastError();  // nothing to report at the end of a run; clear the error
  return false;
}

}  // namespace sg::cuda
