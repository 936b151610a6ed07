#pragma once
// The whole training step of a small MLP as ONE cooperative kernel: batch
// fetch, every Linear(+ReLU) forward, softmax cross-entropy, every backward
// matmul and the fused SGD updates, and the step-counter advance. Between
// dependent phases the grid synchronises (cooperative groups) instead of
// ending a kernel, so a step costs one launch instead of ~18. Matmuls use
// tensor cores (wmma 16x16x16, fp16 in, fp32 accumulate); every intermediate
// is rounded to fp16 where the cuBLASLt schedule rounds it, so both paths
// follow the same math (tests compare them and the CPU backend).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ops/cuda/kernels.hpp"

namespace sg::cuda {

constexpr int kWholeStepMaxLayers = 8;
constexpr int kWholeStepMaxBatch = 64;
constexpr int kWholeStepMaxClasses = 32;

// Layer l maps dims[l] -> dims[l+1]; weights are [dims[l+1], dims[l]] row-major.
struct WholeStepArgs {
  int layers = 0;
  int batch = 0;
  int dims[kWholeStepMaxLayers + 1] = {};
  __half* weight[kWholeStepMaxLayers] = {};
  __half* bias[kWholeStepMaxLayers] = {};
  const SgdScalars* weight_sgd[kWholeStepMaxLayers] = {};
  const SgdScalars* bias_sgd[kWholeStepMaxLayers] = {};
  // Hidden layers l < layers-1 only (the logits stay in shared memory):
  // act[l] = ReLU output of layer l, [batch, dims[l+1]]; grad[l] =
  // dloss/d(pre-activation) of layer l, same shape. Scratch owned by the caller.
  __half* act[kWholeStepMaxLayers] = {};
  __half* grad[kWholeStepMaxLayers] = {};
  // batch fetch: rows perm[(step mod (rows/batch))*batch + i] of the u8 tables
  const std::int32_t* perm = nullptr;
  std::int64_t rows = 0;
  std::int32_t* step = nullptr;  // advanced by one at the end of the step
  const std::uint8_t* images = nullptr;
  const std::uint8_t* labels = nullptr;
  float scale = 1.f, shift = 0.f;
  float* loss = nullptr;  // mean cross-entropy of the batch
  // Profiling only: when set, block 0 stores the GPU clock (ns) at the start
  // and after each phase: whole_step_phase_names(layers) names the gaps.
  unsigned long long* phase_clock = nullptr;
};

// Names of the phases between consecutive phase_clock entries.
std::vector<std::string> whole_step_phase_names(int layers);

// Empty when the kernel runs these sizes; otherwise why not (for logs/dumps).
std::string whole_step_unsupported(const WholeStepArgs& args);
// How the kernel is launched: a cooperative grid of up to one block per SM
// with grid barriers, or ONE thread-block cluster (up to 16 blocks on
// Hopper) with hardware cluster barriers. The cluster's barriers are cheaper
// but its 16 SMs do less per phase; measured, the grid is as fast or faster
// (docs/performance.md), so the cluster runs only on request.
struct WholeStepLaunch {
  int blocks = 0;
  bool cluster = false;
};
// Picks the launch (SG_WHOLE_STEP_MODE=grid|cluster forces one, for
// benchmarks); also sets the kernels' attributes, so call it once before the
// first launch and outside stream capture.
WholeStepLaunch plan_whole_step_launch(const WholeStepArgs& args);
void launch_whole_step(const WholeStepArgs& args, const WholeStepLaunch& launch, cudaStream_t stream);

}  // namespace sg::cuda
