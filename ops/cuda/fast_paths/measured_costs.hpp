#pragma once
// Every measured speed rule of the fast paths in one place (issue 35): the
// thresholds where one of our kernels stops beating the core lowerings.
// These are NOT hardware limits (shared memory, grid sizes, tile shapes:
// those stay with their kernels); each is a benchmark result, named with the
// device and benchmark it came from, to re-measure on another GPU. In ops/
// (not runtime/) because a kernel's own host code picks a variant by some of
// them (the one-pass backward's); the lowerings read the rest.
#include <cstdint>

namespace sg::cuda::measured {

// whole_step (runtime/cuda/fast_paths/whole_step/whole_step_support.cpp).
// H100 SXM, `stepgraph bench` 784-H-H-H-10, us per step, docs/performance.md
// section 18: at batch 16 and 32 the per-launch schedule's dependent-launch
// kernels beat the whole-step kernel at every width measured, one or 16 steps
// per launch (width 64: 20.1 against 27.1, x16 18.8 against 22.5 resident;
// width 128: 19.9 against 23.4 resident).
inline constexpr std::int64_t kPerLaunchFasterBatches[] = {16, 32};
// Other batches (48, 64), measured against the two-pass schedule they still
// take (H100, same bench): the whole-step kernel pays up to 64K parameters at
// one step per launch, the resident-weights variant up to 256K for several.
inline constexpr std::int64_t kWholeStepMaxParameters = std::int64_t(1) << 16;
inline constexpr std::int64_t kResidentStepMaxParameters = std::int64_t(1) << 18;

// small_batch_forward (fast_paths/small_batch_forward/small_batch_forward.cpp):
// up to how many output columns our batch-16/32 forward beats cuBLASLt inside
// the step. H100, `stepgraph bench --batches 32`, docs/performance.md section
// 16: width 1024 37.1 against 37.2 us per step, 2048 56.5 against 55.5.
inline constexpr std::int64_t kSmallBatchForwardMaxColumns = 1024;

// our_conv (fast_paths/our_conv/our_conv_record.cpp): our implicit-GEMM
// convolution where input x output channels <= 256. H100, `stepgraph bench
// --config configs/mnist_cnn.yaml` (and mnist_cnn_fast.yaml), docs/benchmarks.md
// "CNN": faster than cuDNN's best engine for the report CNN's 1->10 and 10->20
// layers at batch 64 and 256 and the fast config's 1->32, far slower at 32->64.
inline constexpr std::int64_t kOurConvMaxChannelProduct = 256;

// fused_update's wgrad_update (runtime/cuda/fast_paths/fused_update/wgrad_update.cpp). H100, graph
// replay of 784-H-H-10 AdamW against cuBLASLt's weight gradients +
// update_multi_tensor: fp32 master weights at H = 1024, batch 128: 81.1 -> 77.9
// us per step; fp16 weights slower (batch 128: 67.4 vs 59.7, 256: 71.9 vs
// 61.3); H = 8192 at batch 256 compute-bound (1200.6 vs 805.3). So fp32 master
// weights, batch <= 128, W up to 1024 x 1024 elements.
inline constexpr std::int64_t kWgradUpdateMaxBatch = 128;
inline constexpr std::int64_t kWgradUpdateMaxWeightElements = std::int64_t(1024) * 1024;

// one_pass_backward's kernel variants (ops/cuda/fast_paths/one_pass_backward/dgrad_wgrad.cpp).
// The row-range variant from this many columns of W up: measured inside the
// training step at batch 32 (H100, docs/performance.md section 11): at
// K = N = 8192 it takes 112-117 us per layer against 151-159 for column
// strips; at 4096 42-47 against 34-42, at 2048 19-22 against 17.6.
inline constexpr std::int64_t kOnePassRowRangesFromK = 8192;
// Batch 256 runs the wgmma kernel from this many columns up. Stand-alone at
// K = N = 8192 (H100) it takes 144-149 us against 160-172 for the autotuned
// cuBLASLt dgrad and fused update; at 4096 69-80 us against 46 (its 64 blocks
// leave half the SMs idle), docs/performance.md section 24.
inline constexpr std::int64_t kOnePassWgmmaFromK = 8192;

}  // namespace sg::cuda::measured
