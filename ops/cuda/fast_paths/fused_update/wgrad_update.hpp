#pragma once
// A layer's weight gradient with its update in the epilogue, for any update
// rule (update_rules/update_rule.hpp; issue 21 made it for Adam, issue 35 made
// it generic): for dY [batch, N] and X [batch, K] (fp16), each block computes
// a 64 x 64 tile of G = dY^T X on tensor cores (fp32 accumulation), rounds it
// to the matmul output's type G (as the buffered path's matmul writes it),
// and applies the rule to that tile of W [N, K] and its state slots (fp32)
// through the same device function as the multi-tensor update. The gradient
// never goes through memory: one read and write of W and the slots. The step
// counter is read before its advance; no clipping (the clip scale needs every
// gradient first). The layer's bias may ride along: its gradient (dY's
// column sums, rounded to G as the buffered reduce_rows writes them) goes
// into the same rule in the blocks of W's first column tile, so a linear
// layer's whole update is one launch.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "ops/cuda/kernels.hpp"
#include "ops/cuda/update_rules/update_rule.hpp"

namespace sg::cuda {

// Empty when launch_wgrad_update takes these sizes, else why not (K a
// multiple of 8: X's and W's 16-byte rows; any N: dY's rows are read by element
// when N is not a multiple of 8).
std::string wgrad_update_unsupported(std::int64_t batch, std::int64_t n, std::int64_t k);

// The bias updated in the weight's launch (bias == nullptr: none): its own
// slots, scalars (learning rate, weight decay) and hyperparameters, the same
// rule and types as the weight.
template <class Rule, typename W>
struct TileBias {
  W* bias = nullptr;
  StateSlots state{};
  const UpdateScalars* scalars = nullptr;
  HyperOf<Rule> hyper{};
};

// W: float or __half; G (the gradient's rounding): __half or float (the
// scheduler uses <float, __half>, fp32 master weights: runtime/cuda/lowerings/
// wgrad_update.cpp says where it measured faster than the buffered path).
// Every pointer 16-byte aligned. `dependent`: a programmatic dependent launch
// (dependent_launch.cuh: W and the slots are read before the wait, dY and X after).
template <class Rule, typename W, typename G>
void launch_wgrad_update(const __half* dy, const __half* x, std::int64_t batch, std::int64_t n, std::int64_t k, W* w,
                         StateSlots state, const UpdateScalars* scalars, const std::int32_t* step,
                         HyperOf<Rule> hyper, cudaStream_t stream, bool dependent = false,
                         TileBias<Rule, W> bias = {});

}  // namespace sg::cuda
