#include "runtime/cuda/device_warmup.hpp"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <chrono>

namespace sg::cuda {
namespace {

// One heuristic query for a small fp16 matmul: cuBLASLt builds its kernel
// tables on the first query of a process (about 0.1 s on the H100), which
// would otherwise land in the trainer's first lowering.
void warm_up_cublaslt(cublasLtHandle_t handle) {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  if (cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatrixLayoutCreate(&a, CUDA_R_16F, 128, 128, 128) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatrixLayoutCreate(&b, CUDA_R_16F, 128, 128, 128) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatrixLayoutCreate(&c, CUDA_R_16F, 128, 128, 128) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS) {
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    (void)cublasLtMatmulAlgoGetHeuristic(handle, op, a, b, c, c, pref, 1, &result, &found);
  }
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  for (auto* layout : {c, b, a})
    if (layout) cublasLtMatrixLayoutDestroy(layout);
  if (op) cublasLtMatmulDescDestroy(op);
}

}  // namespace

WarmupTimes warm_up_device() noexcept {
  WarmupTimes t;
  auto start = std::chrono::steady_clock::now();
  const auto lap = [&start] {
    const auto now = std::chrono::steady_clock::now();
    const double s = std::chrono::duration<double>(now - start).count();
    start = now;
    return s;
  };
  int count = 0;
  const bool driver = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  t.driver_s = lap();
  if (!driver) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return t;
  }
  // cudaFree(nullptr) is the documented idiom that forces context creation.
  const bool context = cudaFree(nullptr) == cudaSuccess;
  t.context_s = lap();
  if (!context) {
    (void)cudaGetLastError();
    return t;
  }
  t.device = true;
  cublasLtHandle_t handle = nullptr;
  if (cublasLtCreate(&handle) == CUBLAS_STATUS_SUCCESS) {
    warm_up_cublaslt(handle);
    cublasLtDestroy(handle);
  }
  t.cublaslt_s = lap();
  return t;
}

}  // namespace sg::cuda
