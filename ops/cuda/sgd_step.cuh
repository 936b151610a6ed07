#pragma once
// PyTorch's SGD step on one element (dampening 0): g' = g + wd*w; with
// momentum v = momentum*v + g', w -= lr*v; else w -= lr*g'. Shared by every
// kernel that updates a parameter element by element, so they agree bit for bit.
#include "ops/cuda/kernels.hpp"

namespace sg::cuda {

__device__ __forceinline__ float sgd_step(float w, float g, float* v, const SgdScalars& s) {
  const float grad = g + s.weight_decay * w;
  if (v) {
    *v = s.momentum * *v + grad;
    return w - s.lr * *v;
  }
  return w - s.lr * grad;
}

// The same step with the velocity in a register (updated in place; read only
// with `momentum`): the same operations as above, so the same bits.
__device__ __forceinline__ float sgd_step(float w, float g, bool momentum, float& v, const SgdScalars& s) {
  const float grad = g + s.weight_decay * w;
  if (momentum) {
    v = s.momentum * v + grad;
    return w - s.lr * v;
  }
  return w - s.lr * grad;
}

}  // namespace sg::cuda
