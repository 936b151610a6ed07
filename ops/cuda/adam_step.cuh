#pragma once
// PyTorch's Adam/AdamW step on one element, shared by every kernel that
// applies it (the multi-tensor update and the bias-gradient update in
// optimizer_kernels.cu, the weight gradient's tile in wgrad_adam.cu), so they
// agree bit for bit. Bias correction from the device step counter:
// t = step + 1 (the graph's counter before its advance).
#include <cstdint>

#include "ops/cuda/optimizer_kernels.hpp"

namespace sg::cuda {

// The per-step constants of Adam's update of one element.
struct AdamStep {
  float b1, b2, one_minus_b1, one_minus_b2, eps, step_size, inv_bias2_sqrt, decay, l2, scale;
};

__device__ __forceinline__ AdamStep adam_step_constants(const AdamHyper& h, float lr, std::int32_t step,
                                                        const float* clip_scale) {
  const float t = float(step) + 1.f;
  AdamStep s;
  s.b1 = h.beta1;
  s.b2 = h.beta2;
  s.one_minus_b1 = 1.f - h.beta1;
  s.one_minus_b2 = 1.f - h.beta2;
  s.eps = h.eps;
  s.step_size = lr / (1.f - powf(h.beta1, t));
  s.inv_bias2_sqrt = 1.f / sqrtf(1.f - powf(h.beta2, t));
  s.decay = h.decoupled ? 1.f - lr * h.weight_decay : 1.f;
  s.l2 = h.decoupled ? 0.f : h.weight_decay;
  s.scale = clip_scale ? *clip_scale : 1.f;
  return s;
}

// One element: returns the new weight, updates m and v. Every rounding is
// spelled out (the _rn intrinsics are never contracted into FMAs), so the
// compiler cannot round differently in different kernels (it did: the same
// expressions gave v one ulp apart once the tile kernel knew the clip scale was 1).
__device__ __forceinline__ float adam_element(float w, float g, float& m, float& v, const AdamStep& s) {
  g = __fadd_rn(__fmul_rn(g, s.scale), __fmul_rn(s.l2, w));
  w = __fmul_rn(w, s.decay);
  m = __fmaf_rn(s.b1, m, __fmul_rn(s.one_minus_b1, g));
  v = __fmaf_rn(s.b2, v, __fmul_rn(__fmul_rn(s.one_minus_b2, g), g));
  return __fsub_rn(w, __fdiv_rn(__fmul_rn(s.step_size, m), __fadd_rn(__fmul_rn(__fsqrt_rn(v), s.inv_bias2_sqrt), s.eps)));
}

}  // namespace sg::cuda
