#pragma once
// Layer normalisation on the GPU (issue 37), the CPU reference's contract
// (ops/cpu/norm_reference.hpp): x [rows, d] normalised per row with gamma,
// beta [d]; the backward recomputes each row's mean and 1/std from x. f32
// statistics and accumulation; results rounded to their types once.
//
// Forward: one block per row (grid-stride over rows): the mean, then the
// variance of the row's deviations (two passes, as the reference, not
// E[x^2] - mean^2), then y. Backward: the same per-row block for dx (two
// more block sums: mean(g), mean(g * xhat)), storing the row's mean and
// 1/std; then one thread per column sums dgamma and dbeta over the rows in
// row order (no atomics: the same bits every run).
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/cuda_resources.hpp"

namespace sg::cuda {

// gamma, beta and their gradients have x's type (the graph casts fp32
// master parameters to the compute type before the layer).
template <typename T>
void launch_layer_norm_forward(const T* x, const T* gamma, const T* beta, std::int64_t rows, std::int64_t d, float eps,
                               T* y, cudaStream_t stream);

// The backward's geometry and its scratch (each row's mean and 1/std, from
// the dx pass to the column sums); one object per launch site.
class LayerNormBackward {
 public:
  LayerNormBackward(std::int64_t rows, std::int64_t d, float eps);

  // dx, dgamma, dbeta: each null when nothing reads it (not written).
  template <typename T>
  void run(const T* dy, const T* x, const T* gamma, T* dx, T* dgamma, T* dbeta, cudaStream_t stream) const;

 private:
  std::int64_t rows_, d_;
  float eps_;
  DeviceBuffer moments_;  // [rows] means, then [rows] 1/std, f32
};

}  // namespace sg::cuda
