#include "ops/cuda/cublaslt_library.hpp"

#include <dlfcn.h>

#include <mutex>

#include <fmt/format.h>

#include "ops/cuda/cuda_check.hpp"

// CMake passes the library's soname (found by the dynamic loader through the
// program's run path or the system's) and the full path it found at configure
// time (tried second).
#ifndef STEPGRAPH_CUBLASLT_SONAME
#error "STEPGRAPH_CUBLASLT_SONAME (e.g. \"libcublasLt.so.13\") must be defined by the build"
#endif
#ifndef STEPGRAPH_CUBLASLT_PATH
#define STEPGRAPH_CUBLASLT_PATH ""
#endif

namespace sg::cuda {
namespace {

// Every cublasLt* function this project calls, as the library's own symbols.
#define SG_CUBLASLT_FUNCTIONS(X)          \
  X(cublasLtCreate)                       \
  X(cublasLtDestroy)                      \
  X(cublasLtGetStatusName)                \
  X(cublasLtGetStatusString)              \
  X(cublasLtMatmul)                       \
  X(cublasLtMatmulAlgoCapGetAttribute)    \
  X(cublasLtMatmulAlgoCheck)              \
  X(cublasLtMatmulAlgoConfigGetAttribute) \
  X(cublasLtMatmulAlgoConfigSetAttribute) \
  X(cublasLtMatmulAlgoGetHeuristic)       \
  X(cublasLtMatmulDescCreate)             \
  X(cublasLtMatmulDescDestroy)            \
  X(cublasLtMatmulDescSetAttribute)       \
  X(cublasLtMatmulPreferenceCreate)       \
  X(cublasLtMatmulPreferenceDestroy)      \
  X(cublasLtMatmulPreferenceSetAttribute) \
  X(cublasLtMatrixLayoutCreate)           \
  X(cublasLtMatrixLayoutDestroy)

struct CublasLtApi {
#define SG_CUBLASLT_POINTER(name) decltype(&::name) name = nullptr;
  SG_CUBLASLT_FUNCTIONS(SG_CUBLASLT_POINTER)
#undef SG_CUBLASLT_POINTER
  std::string path;
};

CublasLtApi open_cublaslt() {
  CublasLtApi api;
  void* lib = nullptr;
  std::string reasons;
  for (const char* candidate : {STEPGRAPH_CUBLASLT_SONAME, STEPGRAPH_CUBLASLT_PATH}) {
    if (candidate[0] == '\0') continue;
    // Never closed: the process keeps it, as it would a linked library.
    lib = dlopen(candidate, RTLD_NOW | RTLD_LOCAL);
    if (lib) {
      api.path = candidate;
      break;
    }
    const char* why = dlerror();
    reasons += fmt::format("{}{}", reasons.empty() ? "" : "; ", why ? why : candidate);
  }
  if (!lib)
    throw CudaError(fmt::format("cannot load cuBLASLt, which the CUDA backend needs ({}); install the CUDA toolkit's "
                                "cuBLAS or train on the CPU with backend.kind: cpu",
                                reasons));
#define SG_CUBLASLT_RESOLVE(name)                                                                               \
  api.name = reinterpret_cast<decltype(&::name)>(dlsym(lib, #name));                                           \
  if (!api.name)                                                                                               \
    throw CudaError(fmt::format("cuBLASLt at {} has no function {}: it is older than the CUDA toolkit this "    \
                                "program was built with; install a matching cuBLAS",                           \
                                api.path, #name));
  SG_CUBLASLT_FUNCTIONS(SG_CUBLASLT_RESOLVE)
#undef SG_CUBLASLT_RESOLVE
  return api;
}

std::once_flag g_loaded;
CublasLtApi g_api;

const CublasLtApi& api() {
  // A failed load throws out of call_once, which lets the next caller try again.
  std::call_once(g_loaded, [] { g_api = open_cublaslt(); });
  return g_api;
}

}  // namespace

void load_cublaslt() { (void)api(); }

std::string cublaslt_library_path() { return api().path; }

}  // namespace sg::cuda

// The functions the project calls, each forwarded to the loaded library.
extern "C" {

cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t* handle) { return sg::cuda::api().cublasLtCreate(handle); }

cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t handle) { return sg::cuda::api().cublasLtDestroy(handle); }

const char* CUBLASWINAPI cublasLtGetStatusName(cublasStatus_t status) {
  return sg::cuda::api().cublasLtGetStatusName(status);
}

const char* CUBLASWINAPI cublasLtGetStatusString(cublasStatus_t status) {
  return sg::cuda::api().cublasLtGetStatusString(status);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                                           const void* a, cublasLtMatrixLayout_t a_desc, const void* b,
                                           cublasLtMatrixLayout_t b_desc, const void* beta, const void* c,
                                           cublasLtMatrixLayout_t c_desc, void* d, cublasLtMatrixLayout_t d_desc,
                                           const cublasLtMatmulAlgo_t* algo, void* workspace,
                                           size_t workspace_bytes, cudaStream_t stream) {
  return sg::cuda::api().cublasLtMatmul(handle, desc, alpha, a, a_desc, b, b_desc, beta, c, c_desc, d, d_desc, algo,
                                        workspace, workspace_bytes, stream);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoCapGetAttribute(const cublasLtMatmulAlgo_t* algo,
                                                              cublasLtMatmulAlgoCapAttributes_t attr, void* buf,
                                                              size_t size, size_t* written) {
  return sg::cuda::api().cublasLtMatmulAlgoCapGetAttribute(algo, attr, buf, size, written);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoCheck(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                                    cublasLtMatrixLayout_t a_desc, cublasLtMatrixLayout_t b_desc,
                                                    cublasLtMatrixLayout_t c_desc, cublasLtMatrixLayout_t d_desc,
                                                    const cublasLtMatmulAlgo_t* algo,
                                                    cublasLtMatmulHeuristicResult_t* result) {
  return sg::cuda::api().cublasLtMatmulAlgoCheck(handle, desc, a_desc, b_desc, c_desc, d_desc, algo, result);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoConfigGetAttribute(const cublasLtMatmulAlgo_t* algo,
                                                                 cublasLtMatmulAlgoConfigAttributes_t attr, void* buf,
                                                                 size_t size, size_t* written) {
  return sg::cuda::api().cublasLtMatmulAlgoConfigGetAttribute(algo, attr, buf, size, written);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoConfigSetAttribute(cublasLtMatmulAlgo_t* algo,
                                                                 cublasLtMatmulAlgoConfigAttributes_t attr,
                                                                 const void* buf, size_t size) {
  return sg::cuda::api().cublasLtMatmulAlgoConfigSetAttribute(algo, attr, buf, size);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                                           cublasLtMatrixLayout_t a_desc,
                                                           cublasLtMatrixLayout_t b_desc,
                                                           cublasLtMatrixLayout_t c_desc,
                                                           cublasLtMatrixLayout_t d_desc,
                                                           cublasLtMatmulPreference_t preference, int requested,
                                                           cublasLtMatmulHeuristicResult_t results[],
                                                           int* returned) {
  return sg::cuda::api().cublasLtMatmulAlgoGetHeuristic(handle, desc, a_desc, b_desc, c_desc, d_desc, preference,
                                                        requested, results, returned);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                                     cudaDataType_t scale) {
  return sg::cuda::api().cublasLtMatmulDescCreate(desc, compute, scale);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  return sg::cuda::api().cublasLtMatmulDescDestroy(desc);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                                           cublasLtMatmulDescAttributes_t attr, const void* buf,
                                                           size_t size) {
  return sg::cuda::api().cublasLtMatmulDescSetAttribute(desc, attr, buf, size);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  return sg::cuda::api().cublasLtMatmulPreferenceCreate(pref);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  return sg::cuda::api().cublasLtMatmulPreferenceDestroy(pref);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                                 cublasLtMatmulPreferenceAttributes_t attr,
                                                                 const void* buf, size_t size) {
  return sg::cuda::api().cublasLtMatmulPreferenceSetAttribute(pref, attr, buf, size);
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                                       uint64_t rows, uint64_t cols, int64_t ld) {
  return sg::cuda::api().cublasLtMatrixLayoutCreate(layout, type, rows, cols, ld);
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  return sg::cuda::api().cublasLtMatrixLayoutDestroy(layout);
}

}  // extern "C"
