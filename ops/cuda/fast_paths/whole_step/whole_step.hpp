#pragma once
// The whole training step of a small MLP as ONE cooperative kernel: batch
// fetch, every Linear(+activation) forward, softmax cross-entropy, every backward
// matmul and the fused SGD updates, and the step-counter advance (or, for any
// other optimizer, the gradients for the update stage: gradients_out). Between
// dependent phases the grid synchronises (cooperative groups) instead of
// ending a kernel, so a step costs one launch instead of ~18. Matmuls use
// tensor cores (wmma 16x16x16, fp16 in, fp32 accumulate); every intermediate
// is rounded to fp16 where the cuBLASLt schedule rounds it, so both paths
// follow the same math (tests compare them and the CPU backend). The hidden
// layers' activation is any of activation.hpp's, a template argument of the
// kernels (the ReLU instances are the kernels they always were); for the
// others the activation rounds as our per-launch kernels do: z = fp16(x W^T +
// b), act(z) in fp32 rounded once, the backward act'(dY W) rounded once.
// Files: whole_step.cu (the kernel and its launch; its phases in
// whole_step_phases.cuh), resident_step.hpp/.cu (the resident variant),
// step_common.cuh (what both kernels share).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ops/cuda/activation.hpp"
#include "ops/cuda/kernels.hpp"
#include "ops/cuda/fast_paths/whole_step/resident_step.hpp"

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
  const UpdateScalars* weight_sgd[kWholeStepMaxLayers] = {};
  const UpdateScalars* bias_sgd[kWholeStepMaxLayers] = {};
  // Hidden layers l < layers-1 only (the logits stay in shared memory):
  // act[l] = activation output of layer l, [batch, dims[l+1]]; grad[l] =
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
  // and after each phase (of the first step): whole_step_phase_names names the gaps.
  unsigned long long* phase_clock = nullptr;
  // (Last, so the fields above keep their offsets in the ReLU kernels' parameters.)
  // The hidden layers' activation. Where its backward reads the forward input
  // (gelu, gelu_tanh, silu: backward_reads_input), pre[l] = layer l's
  // pre-activation, [batch, dims[l+1]], scratch owned by the caller (hidden
  // layers only; the resident kernel keeps it in shared memory instead).
  Activation activation = Activation::relu;
  __half* pre[kWholeStepMaxLayers] = {};
  // Gradients out (issue 35: the update stage's form): every layer's weight
  // and bias gradient, [dims[l+1], dims[l]] and [dims[l+1]], stored in fp16
  // as the graph's gradient values instead of the in-kernel SGD step; the
  // parameters and the step counter are left to the update stage's launch
  // after the kernel (any update rule). The grid and cluster kernels only.
  bool gradients_out = false;
  __half* weight_grad[kWholeStepMaxLayers] = {};
  __half* bias_grad[kWholeStepMaxLayers] = {};
};

// Empty when the kernel runs these sizes; otherwise why not (for logs/dumps).
std::string whole_step_unsupported(const WholeStepArgs& args);
// How the step is launched: with the weights resident in ONE thread-block
// cluster's shared memory (resident_step.hpp: many steps per launch, DSMEM
// exchanges), as a cooperative grid of up to one block per SM with grid
// barriers, or as ONE cluster (up to 16 blocks on Hopper) of the same
// per-step kernel with hardware cluster barriers. Measured on an H100
// (docs/performance.md): the resident kernel wins only when a launch runs
// many steps (its weights are loaded and stored once per launch), so it is
// picked where it fits (widths up to 256 of 784-H-H-H-10) for runs of
// several steps per launch; else the grid, which beats the plain cluster.
struct WholeStepLaunch {
  int blocks = 0;
  bool cluster = false;
  bool resident = false;
  ResidentLayout layout;  // when resident
};
// Which variant the caller asks for (BackendOptions::whole_step_mode):
// automatic picks as measured (above); grid / cluster / resident force one
// wherever it fits (benchmarks, tests, sanitizers), else the grid.
enum class WholeStepVariant : std::uint8_t { automatic, grid, cluster, resident };
struct WholeStepChoice {
  WholeStepVariant variant = WholeStepVariant::automatic;
  int resident_cluster = 0;  // resident: the cluster size (plan_resident_layout), 0 the largest that fits
};
// Picks the launch for runs of `steps_per_launch` steps per launch as
// `choice` asks; also sets the kernels' attributes, so call it once before
// the first launch and outside stream capture.
WholeStepLaunch plan_whole_step_launch(const WholeStepArgs& args, int steps_per_launch, const WholeStepChoice& choice);
// `steps` consecutive training steps: one launch when resident, else one per step.
void launch_whole_step(const WholeStepArgs& args, const WholeStepLaunch& launch, cudaStream_t stream, int steps = 1);
// Names of the phases between consecutive phase_clock entries of this launch.
std::vector<std::string> whole_step_phase_names(const WholeStepArgs& args, const WholeStepLaunch& launch);

}  // namespace sg::cuda
