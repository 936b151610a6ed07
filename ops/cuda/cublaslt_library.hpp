#pragma once
// cuBLASLt, loaded when first needed instead of when the program starts.
//
// libcublasLt is over 500 MB and runs thousands of static initialisers that
// touch about 200 MB of its data when it is loaded: about 0.07-0.09 s before
// main() when the program links it, for every command (`stepgraph --version`
// included) and on the critical path of a training run. So the program does
// not link it: cublaslt_library.cpp defines the cublasLt* functions this
// project calls (with the header's own signatures, so a mismatch does not
// compile) and forwards each to the library opened with dlopen on first use.
// The CUDA start-up (runtime/cuda/device_warmup.cpp) loads it on a worker
// thread while the primary context is created.
//
// A cublasLt* function not defined there fails to link: add it to the list in
// cublaslt_library.cpp.
#include <string>

namespace sg::cuda {

// Opens cuBLASLt and resolves every function this project calls, once per
// process (thread-safe; later calls return at once). Throws CudaError with one
// line naming the library and the loader's reason when it cannot.
void load_cublaslt();

// Where it was loaded from (after load_cublaslt()), for messages.
std::string cublaslt_library_path();

}  // namespace sg::cuda
