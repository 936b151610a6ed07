#pragma once
// The part of cuDNN 9's graph (backend) API stepgraph uses, as RAII owners:
// a handle, a backend descriptor, and an operation graph turned into the
// execution plans cuDNN's heuristics offer. Callers describe tensors and
// operations (ops/cuda/conv_cudnn.cpp for convolutions); this file knows no
// particular operation.
#include <cudnn.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ops/cuda/cuda_check.hpp"

namespace sg::cuda::cudnn {

// Throws CudaError naming the call, the status and cuDNN's last error text.
void check(cudnnStatus_t status, const char* call, const char* file, int line);

class Handle {
 public:
  Handle();
  ~Handle();
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  cudnnHandle_t get() const { return h_; }

 private:
  cudnnHandle_t h_ = nullptr;
};

// One backend descriptor (tensor, operation, graph, plan, ...).
class Descriptor {
 public:
  Descriptor() = default;
  explicit Descriptor(cudnnBackendDescriptorType_t type);
  ~Descriptor();
  Descriptor(Descriptor&& other) noexcept : d_(std::exchange(other.d_, nullptr)) {}
  Descriptor& operator=(Descriptor&& other) noexcept;
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;

  cudnnBackendDescriptor_t get() const { return d_; }
  const cudnnBackendDescriptor_t* address() const { return &d_; }
  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, std::int64_t count, const void* values);
  void set_descriptor(cudnnBackendAttributeName_t name, const Descriptor& value);
  void set_int64s(cudnnBackendAttributeName_t name, const std::vector<std::int64_t>& values);
  void finalize();
  // finalize() that reports, instead of throwing, an engine that does not
  // support the graph (the heuristics list engines that may refuse), and
  // with `internal_errors_too` one whose runtime compilation failed.
  bool try_finalize(bool internal_errors_too = false);

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// A tensor of the operation graph: dims and strides in cuDNN's N, C, spatial
// order; a virtual tensor lives only inside a fused engine.
struct TensorSpec {
  std::int64_t uid = 0;
  cudnnDataType_t type = CUDNN_DATA_HALF;
  std::vector<std::int64_t> dims, strides;
  bool is_virtual = false;
  std::int64_t alignment = 16;  // bytes the bound pointer is aligned to
};
Descriptor make_tensor(const TensorSpec& spec);

// NCHW-packed strides of `dims`.
std::vector<std::int64_t> packed_strides(const std::vector<std::int64_t>& dims);

// One finalized execution plan.
struct Plan {
  Descriptor plan;
  std::int64_t workspace_bytes = 0;
  std::int64_t engine = -1;  // cuDNN's global engine index, for the dump
  std::string knobs;  // "" (the configuration cuDNN gave) or the one knob set, "SPLIT_K_SLC=4"
  bool runtime_compiled = false;  // its kernel was compiled at finalization (NVRTC)
};

// The plans for the finalized operation graph `graph`: those cuDNN's
// heuristics offer (mode A, then the fallback list), then with `every_engine` every other
// precompiled engine cuDNN has for it in its default configuration (a
// runtime-compiled one only where the heuristics offer it), at most `limit` in all,
// leaving out engines with any of the `excluded` numerical notes.
std::vector<Plan> candidate_plans(const Handle& handle, const Descriptor& graph, std::size_t limit,
                                  const std::vector<cudnnBackendNumericalNote_t>& excluded, bool every_engine);

// Up to `limit` configurations of the precompiled `engines` (global indices)
// with one knob (split-K, tile, stages, ...) set away from its default, each
// to up to 8 values of its range; none asks for more than 64 MiB of workspace.
std::vector<Plan> knob_variant_plans(const Handle& handle, const Descriptor& graph,
                                     const std::vector<std::int64_t>& engines, std::size_t limit,
                                     const std::vector<cudnnBackendNumericalNote_t>& excluded);

// Runs `plan` with the tensors `uids` bound to `pointers`, on `stream`.
void execute(const Handle& handle, const Plan& plan, const std::vector<std::int64_t>& uids,
             const std::vector<void*>& pointers, void* workspace, cudaStream_t stream);

// The alignment (<= 16 bytes) of a device pointer, as a tensor descriptor states it.
std::int64_t pointer_alignment(const void* pointer);

}  // namespace sg::cuda::cudnn

#define SG_CUDNN_CHECK(call) ::sg::cuda::cudnn::check((call), #call, __FILE__, __LINE__)
