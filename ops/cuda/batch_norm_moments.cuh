#pragma once
// What both batch normalisation paths (batch_norm.cu's per-channel clusters,
// batch_norm_rows.cu's whole-GPU rows) compute from a channel's sums, in one
// place so that both give the same values from the same sums.
#include <cstdint>

namespace sg::cuda {

struct Moments {
  float mean, var, rstd;
};

// The moments from sums of the deviations from `shift` (a value of the
// channel, so the mean of the deviations is of the order of the spread and
// the one-pass variance keeps its precision): shifted_sum = sum(x - shift),
// shifted_squares = sum((x - shift)^2).
__device__ __forceinline__ Moments moments_from(float shift, float shifted_sum, float shifted_squares, float count,
                                                float eps) {
  const float d = shifted_sum / count;
  const float var = fmaxf(shifted_squares / count - d * d, 0.f);
  return {shift + d, var, 1.f / sqrtf(var + eps)};
}

// running = (1 - momentum) running + momentum * the batch's, the variance
// unbiased (PyTorch's); count values. From the old values, so that a caller
// can load every channel's before it stores any (a store between two loads
// of float arrays that may alias makes their round trips serial).
__device__ __forceinline__ void updated_running(const Moments& m, float count, float momentum, float& mean,
                                                float& var) {
  mean = (1.f - momentum) * mean + momentum * m.mean;
  var = (1.f - momentum) * var + momentum * m.var * count / (count - 1.f);
}

// updated_running in place for channel c.
__device__ __forceinline__ void update_running(const Moments& m, float count, float momentum, std::int64_t c,
                                               float* running_mean, float* running_var) {
  float mean = running_mean[c], var = running_var[c];
  updated_running(m, count, momentum, mean, var);
  running_mean[c] = mean;
  running_var[c] = var;
}

}  // namespace sg::cuda
