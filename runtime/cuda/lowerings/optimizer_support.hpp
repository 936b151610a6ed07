#pragma once
// Type dispatch of the optimizer lowerings (update rules, Nesterov SGD,
// clipping): the (parameter, gradient) element types their kernels are
// instantiated for (ops/cuda/optimizer_kernels.cu, update_rules/, fast_paths/fused_update/).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "graph/dtype.hpp"
#include "graph/op.hpp"
#include "ops/cuda/optimizer_kernels.hpp"

namespace sg::cuda {

// Calls f(W{}, G{}) for a supported pair and returns true; false otherwise.
template <typename F>
bool with_update_types(DType w, DType g, F&& f) {
  if (w == DType::f32 && g == DType::f32) return f(float{}, float{}), true;
  if (w == DType::f16 && g == DType::f16) return f(__half{}, __half{}), true;
  if (w == DType::f32 && g == DType::f16) return f(float{}, __half{}), true;
  if (w == DType::bf16 && g == DType::bf16) return f(__nv_bfloat16{}, __nv_bfloat16{}), true;
  if (w == DType::f32 && g == DType::bf16) return f(float{}, __nv_bfloat16{}), true;
  return false;
}

inline bool update_types_supported(DType w, DType g) {
  return with_update_types(w, g, [](auto, auto) {});
}

// ClipInput::type of a gradient dtype (-1 when the kernels do not read it).
inline int clip_type(DType d) {
  if (d == DType::f32) return 0;
  if (d == DType::f16) return 1;
  if (d == DType::bf16) return 2;
  return -1;
}

}  // namespace sg::cuda
