#pragma once
// PyTorch's Adam/AdamW step as an update rule (update_rule.hpp), shared by
// every kernel that applies it (the multi-tensor update, the bias gradient's
// update, the weight gradient's tile), so they agree bit for bit. Bias
// correction from the device step counter: t = step + 1 (the graph's counter
// before its advance). Slots: 0 = m, 1 = v.
#include <cstdint>

#include "ops/cuda/update_rules/update_rule.hpp"

namespace sg::cuda {

struct AdamRule {
  static constexpr int kStates = RuleTraits<AdamRule>::kStates;
  __device__ static constexpr bool has_state(const AdamHyper&, int) { return true; }

  // The per-launch constants of the update of one element.
  float b1, b2, one_minus_b1, one_minus_b2, eps, step_size, inv_bias2_sqrt, decay, l2, scale;

  __device__ __forceinline__ AdamRule(const AdamHyper& h, float lr, const std::int32_t* step, const float* clip_scale) {
    const float t = float(*step) + 1.f;
    b1 = h.beta1;
    b2 = h.beta2;
    one_minus_b1 = 1.f - h.beta1;
    one_minus_b2 = 1.f - h.beta2;
    eps = h.eps;
    step_size = lr / (1.f - powf(h.beta1, t));
    inv_bias2_sqrt = 1.f / sqrtf(1.f - powf(h.beta2, t));
    decay = h.decoupled ? 1.f - lr * h.weight_decay : 1.f;
    l2 = h.decoupled ? 0.f : h.weight_decay;
    scale = clip_scale ? *clip_scale : 1.f;
  }

  // One element: returns the new weight, updates m and v. Every rounding is
  // spelled out (the _rn intrinsics are never contracted into FMAs), so the
  // compiler cannot round differently in different kernels (it did: the same
  // expressions gave v one ulp apart once the tile kernel knew the clip scale was 1).
  // `slot(i)` is the element's state slot i (a float&).
  template <class Slot>
  __device__ __forceinline__ float operator()(float w, float g, Slot&& slot) const {
    float& m = slot(0);
    float& v = slot(1);
    g = __fadd_rn(__fmul_rn(g, scale), __fmul_rn(l2, w));
    w = __fmul_rn(w, decay);
    m = __fmaf_rn(b1, m, __fmul_rn(one_minus_b1, g));
    v = __fmaf_rn(b2, v, __fmul_rn(__fmul_rn(one_minus_b2, g), g));
    return __fsub_rn(w, __fdiv_rn(__fmul_rn(step_size, m), __fadd_rn(__fmul_rn(__fsqrt_rn(v), inv_bias2_sqrt), eps)));
  }
};

}  // namespace sg::cuda
