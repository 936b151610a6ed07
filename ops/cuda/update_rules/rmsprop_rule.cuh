#pragma once
// PyTorch's RMSprop step (torch.optim.RMSprop) as an update rule
// (update_rule.hpp), the twin of ref::rmsprop_update:
//   g = g * clip_scale + weight_decay * w
//   square_avg = alpha * square_avg + (1 - alpha) * g^2
//   centered: grad_avg = alpha * grad_avg + (1 - alpha) * g,
//             avg = sqrt(square_avg - grad_avg^2) + eps;  else avg = sqrt(square_avg) + eps
//   momentum > 0: buf = momentum * buf + g / avg, w -= lr * buf;  else w -= lr * g / avg
// Slots: 0 = square_avg, 1 = momentum_buf, 2 = grad_avg. No step counter.
#include <cstdint>

#include "ops/cuda/update_rules/update_rule.hpp"

namespace sg::cuda {

struct RmspropRule {
  static constexpr int kStates = RuleTraits<RmspropRule>::kStates;
  __device__ static constexpr bool has_state(const RmspropHyper& h, int slot) {
    return slot == 0 || (slot == 1 && h.momentum > 0.f) || (slot == 2 && h.centered);
  }

  // The per-launch constants of the update of one element.
  float alpha, one_minus_alpha, eps, weight_decay, momentum, lr, scale;
  bool centered, use_momentum;

  __device__ __forceinline__ RmspropRule(const RmspropHyper& h, float lr_, const std::int32_t*, const float* clip_scale)
      : alpha(h.alpha),
        one_minus_alpha(1.f - h.alpha),
        eps(h.eps),
        weight_decay(h.weight_decay),
        momentum(h.momentum),
        lr(lr_),
        scale(clip_scale ? *clip_scale : 1.f),
        centered(h.centered),
        use_momentum(h.momentum > 0.f) {}

  // One element: returns the new weight, updates the used slots. Every
  // rounding spelled out (as adam_rule.cuh's, so all kernels agree bit for bit).
  // `slot(i)` is the element's state slot i (a float&).
  template <class Slot>
  __device__ __forceinline__ float operator()(float w, float g, Slot&& slot) const {
    g = __fadd_rn(__fmul_rn(g, scale), __fmul_rn(weight_decay, w));
    float& square_avg = slot(0);
    square_avg = __fmaf_rn(alpha, square_avg, __fmul_rn(__fmul_rn(one_minus_alpha, g), g));
    float mean_square = square_avg;
    if (centered) {
      float& grad_avg = slot(2);
      grad_avg = __fmaf_rn(alpha, grad_avg, __fmul_rn(one_minus_alpha, g));
      mean_square = __fsub_rn(square_avg, __fmul_rn(grad_avg, grad_avg));
    }
    const float step = __fdiv_rn(g, __fadd_rn(__fsqrt_rn(mean_square), eps));
    if (use_momentum) {
      float& buf = slot(1);
      buf = __fmaf_rn(momentum, buf, step);
      return __fsub_rn(w, __fmul_rn(lr, buf));
    }
    return __fsub_rn(w, __fmul_rn(lr, step));
  }
};

}  // namespace sg::cuda
