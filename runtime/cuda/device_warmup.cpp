#include "runtime/cuda/device_warmup.hpp"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <chrono>
#include <thread>

#include "ops/cuda/cublaslt_library.hpp"

namespace sg::cuda {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

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

// The cuBLASLt half of the warm-up; a load failure is left for the trainer.
void load_and_warm_cublaslt(WarmupTimes& t) noexcept {
  auto start = Clock::now();
  try {
    load_cublaslt();
  } catch (...) {
    t.cublaslt_load_s = seconds_since(start);
    return;
  }
  t.cublaslt_load_s = seconds_since(start);
  start = Clock::now();
  cublasLtHandle_t handle = nullptr;
  if (cublasLtCreate(&handle) == CUBLAS_STATUS_SUCCESS) {
    warm_up_cublaslt(handle);
    cublasLtDestroy(handle);
  }
  t.cublaslt_s = seconds_since(start);
}

}  // namespace

WarmupTimes warm_up_device() noexcept {
  WarmupTimes t;
  const auto begin = Clock::now();
  int count = 0;
  const bool driver = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  t.driver_s = seconds_since(begin);
  if (!driver) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    t.total_s = seconds_since(begin);
    return t;
  }
  // Both threads work on device 0 (a new thread's current device). No
  // cudaSetDevice there: since CUDA 12 it creates the context itself.
  std::thread cublaslt;
  try {
    cublaslt = std::thread([&t] { load_and_warm_cublaslt(t); });
  } catch (...) {  // no thread: the load runs after the context instead
  }
  const auto context_start = Clock::now();
  // cudaFree(nullptr) is the documented idiom that forces context creation.
  const bool context = cudaFree(nullptr) == cudaSuccess;
  t.context_s = seconds_since(context_start);
  if (cublaslt.joinable()) cublaslt.join();
  else if (context) load_and_warm_cublaslt(t);
  if (!context) (void)cudaGetLastError();
  t.device = context;
  t.total_s = seconds_since(begin);
  return t;
}

}  // namespace sg::cuda
