// cuBLASLt is not linked but opened on first use (ops/cuda/cublaslt_library.hpp):
// it must be absent from the process until then, and every forwarded function
// must reach the real library. Host-only calls: no GPU needed.
#include <doctest/doctest.h>

#include <cublasLt.h>

#include <fstream>
#include <sstream>
#include <string>

#include "ops/cuda/cublaslt_library.hpp"

namespace {

bool cublaslt_mapped() {
  std::ifstream maps("/proc/self/maps");
  std::stringstream text;
  text << maps.rdbuf();
  return text.str().find("libcublasLt") != std::string::npos;
}

}  // namespace

TEST_CASE("cuBLASLt is loaded on first use, not at program start, and its functions reach it") {
  // The only test in this binary, so nothing has called into cuBLASLt yet.
  CHECK_FALSE(cublaslt_mapped());
  sg::cuda::load_cublaslt();
  CHECK(cublaslt_mapped());
  CHECK(sg::cuda::cublaslt_library_path().find("libcublasLt") != std::string::npos);
  sg::cuda::load_cublaslt();  // a second call returns at once

  // Host-only calls answered by the library itself.
  CHECK(std::string(cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED)) == "CUBLAS_STATUS_NOT_SUPPORTED");
  CHECK(std::string(cublasLtGetStatusString(CUBLAS_STATUS_SUCCESS)).size() > 0);
  cublasLtMatrixLayout_t layout = nullptr;
  REQUIRE(cublasLtMatrixLayoutCreate(&layout, CUDA_R_16F, 128, 64, 128) == CUBLAS_STATUS_SUCCESS);
  CHECK(layout != nullptr);
  CHECK(cublasLtMatrixLayoutDestroy(layout) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulDesc_t op = nullptr;
  REQUIRE(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
  const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_RELU_BIAS;
  CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue) ==
        CUBLAS_STATUS_SUCCESS);
  // The library checks its arguments: an attribute of the wrong size is refused.
  CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, 1) ==
        CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasLtMatmulDescDestroy(op) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulPreference_t pref = nullptr;
  REQUIRE(cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS);
  const std::size_t workspace = 1 << 20;
  CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                             sizeof workspace) == CUBLAS_STATUS_SUCCESS);
  CHECK(cublasLtMatmulPreferenceDestroy(pref) == CUBLAS_STATUS_SUCCESS);
}
