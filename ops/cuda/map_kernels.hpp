#pragma once
// Element-wise maps by op name (the IR's dump name), for the element-wise
// lowering: y[i] = f(a[i]) or f(a[i], b[i]) over n elements. A new map op
// adds its kernel in elementwise.cu and one line to the table in
// map_kernels.cu; nothing that schedules launches changes. Each entry has
// one function per floating dtype (f32, f16, bf16); a null one means the
// map has no kernel for that dtype and the lowering does not take it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string_view>

namespace sg::cuda {

struct MapKernels {
  int arity = 1;  // inputs; b is null for unary maps
  void (*f32)(const float* a, const float* b, std::int64_t n, float* y, cudaStream_t stream) = nullptr;
  void (*f16)(const __half* a, const __half* b, std::int64_t n, __half* y, cudaStream_t stream) = nullptr;
  void (*bf16)(const __nv_bfloat16* a, const __nv_bfloat16* b, std::int64_t n, __nv_bfloat16* y,
               cudaStream_t stream) = nullptr;
};

// nullptr when no map kernel implements `op`.
const MapKernels* find_map_kernels(std::string_view op);

}  // namespace sg::cuda
