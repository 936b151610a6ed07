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

__device__ __forceinline__ float sgd_step(float w, float g, float* v, const UpdateScalars& s) {
  const float grad = __fmaf_rn(s.weight_decay, w, g);
  if (v) {
    *v = __fmaf_rn(s.momentum, *v, grad);
    return __fmaf_rn(-s.lr, *v, w);
  }
  return __fmaf_rn(-s.lr, grad, w);
}

// PyTorch's SGD(nesterov=True) on one element: g' = g + wd*w, v = momentum*v + g',
// w -= lr * (g' + momentum*v), each step an explicit fused multiply-add (as above).
__device__ __forceinline__ float sgd_nesterov_step(float w, float g, float& v, const UpdateScalars& s) {
  const float grad = __fmaf_rn(s.weight_decay, w, g);
  v = __fmaf_rn(s.momentum, v, grad);
  return __fmaf_rn(-s.lr, __fmaf_rn(s.momentum, v, grad), w);
}

// The same step with the velocity in a register (updated in place; read only
// with `momentum`): the same operations as above, so the same bits.
__device__ __forceinline__ float sgd_step(float w, float g, bool momentum, float& v, const UpdateScalars& s) {
  const float grad = __fmaf_rn(s.weight_decay, w, g);
  if (momentum) {
    v = __fmaf_rn(s.momentum, v, grad);
    return __fmaf_rn(-s.lr, v, w);
  }
  return __fmaf_rn(-s.lr, grad, w);
}

// SGD without momentum in the folded form the cuBLASLt path computes (its
// epilogue w' = beta*w + alpha*g with alpha = -lr, beta = 1 - lr*wd), in
// fp32: what the whole-step and resident-step kernels update their fp16
// parameters with. Spelled with its rounding: (1 - lr*wd) * w rounded, then
// one fused multiply-add of -lr * g onto it. Left to the compiler, `neg_lr * g
// + one_minus_lr_wd * w` contracted either product, varying by call site: the
// resident kernel and the whole-step bias and logits-layer updates rounded
// the w product (as here), the whole-step hidden weight updates the g product.
__device__ __forceinline__ float sgd_step_folded(float w, float g, const UpdateScalars& s) {
  return __fmaf_rn(s.neg_lr, g, __fmul_rn(s.one_minus_lr_wd, w));
}

}  // namespace sg::cuda
