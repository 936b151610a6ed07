#pragma once
// PyTorch's SGD step on one element (dampening 0): g' = g + wd*w; with
// momentum v = momentum*v + g', w -= lr*v; else w -= lr*g'. Shared by every
// kernel that updates a parameter element by element, so they agree bit for
// bit. Each step is an explicit fused multiply-add: left to the compiler,
// `w - lr * g'` became one FMA in some kernels and a multiply then a subtract
// in others (column_sum_kernel, where the two branches join before the
// subtract), and where w and lr*g' nearly cancel the two round differently
// (the output-layer backward and the five launches it replaces disagreed in
// about one test run in six).
#include "ops/cuda/kernels.hpp"

namespace sg::cuda {

__device__ __forceinline__ float sgd_step(float w, float g, float* v, const SgdScalars& s) {
  const float grad = __fmaf_rn(s.weight_decay, w, g);
  if (v) {
    *v = __fmaf_rn(s.momentum, *v, grad);
    return __fmaf_rn(-s.lr, *v, w);
  }
  return __fmaf_rn(-s.lr, grad, w);
}

// The same step with the velocity in a register (updated in place; read only
// with `momentum`): the same operations as above, so the same bits.
__device__ __forceinline__ float sgd_step(float w, float g, bool momentum, float& v, const SgdScalars& s) {
  const float grad = __fmaf_rn(s.weight_decay, w, g);
  if (momentum) {
    v = __fmaf_rn(s.momentum, v, grad);
    return __fmaf_rn(-s.lr, v, w);
  }
  return __fmaf_rn(-s.lr, grad, w);
}

}  // namespace sg::cuda
