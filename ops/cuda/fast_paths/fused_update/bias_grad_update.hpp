#pragma once
// A bias gradient (column sums of dy [rows, cols], f32 accumulation in a
// fixed order) fused with the update of bias[cols] by any update rule
// (update_rules/update_rule.hpp): no gradient buffer, one kernel. No clip
// scale (it exists only after every gradient). Asynchronous on `stream`,
// capturable; lr and the step counter are read from device memory.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/kernels.hpp"
#include "ops/cuda/update_rules/update_rule.hpp"

namespace sg::cuda {

// W, G: (float, float), (__half, __half), (float, __half), (bf16, bf16), (float, bf16).
// `dependent`: a programmatic dependent launch (dependent_launch.cuh) where supported.
template <class Rule, typename W, typename G>
void launch_bias_grad_update(const G* dy, std::int64_t rows, std::int64_t cols, W* bias, StateSlots state,
                             const UpdateScalars* scalars, const std::int32_t* step, HyperOf<Rule> hyper,
                             cudaStream_t stream, bool dependent = false);

}  // namespace sg::cuda
