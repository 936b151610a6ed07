#pragma once
// Typed choices of how the CUDA backend lowers and launches a step: which
// lowerings may run, and the knobs of the kernels behind them. Filled from a
// config's `backend:` section or `stepgraph bench` flags; tests set them
// directly. Nothing here is read from the environment.
#include <cstdint>
#include <string>
#include <string_view>

namespace sg {

// Which whole-step kernel runs a graph that is exactly a small MLP step.
// automatic: where it measured faster than the per-launch schedule; grid /
// cluster / resident: that variant wherever it fits (benchmarks, sanitizers).
enum class WholeStepMode : std::uint8_t { automatic, grid, cluster, resident };

std::string_view whole_step_mode_name(WholeStepMode mode);       // "auto", "grid", "cluster", "resident"
WholeStepMode whole_step_mode_from_name(std::string_view name);  // throws std::invalid_argument

// Who runs the convolutions (forward, data and filter gradients; issue 22):
// automatic: ours where they measured faster (few channels), cuDNN's graph
// API elsewhere; cudnn / implicit_gemm: that one first wherever it takes the
// convolution (ops/cuda/conv_implicit_gemm.cu is ours).
enum class ConvKernels : std::uint8_t { automatic, cudnn, implicit_gemm, tensor_core };
std::string_view conv_kernels_name(ConvKernels kernels);      // "auto", "cudnn", "implicit_gemm", "tensor_core"
ConvKernels conv_kernels_from_name(std::string_view name);    // throws std::invalid_argument

// The layout of the convolution layers' activations (graph/channels_last_pass.hpp):
// automatic: with autotune, both forms built and timed at start-up and the
// faster kept (runtime/cuda/timed_layout_choice.hpp); without, channels-last
// where every channels-last region of the network ends at a flatten or the
// global pooling (no conversion inside it), no whole-step kernel takes the
// channels-first step and our NCHW kernels run no convolution of 2+ input
// channels, not a multiple of 8, that the channels-last step would give to
// cuDNN (runtime/cuda/activation_layout_choice.hpp); nchw / channels_last:
// that one wherever the model has convolutions.
enum class ActivationLayout : std::uint8_t { automatic, nchw, channels_last };
std::string_view activation_layout_name(ActivationLayout layout);      // "auto", "nchw", "channels_last"
ActivationLayout activation_layout_from_name(std::string_view name);  // throws std::invalid_argument

// Empty when the value is one the kernel takes, else why not (for config
// errors and bench flags): strip_splits 0 or a power of two up to
// cuda::kMaxStripSplits; resident_cluster 0 or one of cuda::kResidentClusterSizes.
std::string strip_splits_problem(std::int64_t splits);
std::string resident_cluster_problem(std::int64_t cluster);

struct BackendOptions {
  bool accumulate_f16 = false;  // cuBLASLt compute type fp16 where the output is fp16
  bool autotune = false;        // time cuBLASLt's candidates once per shape
  bool cublaslt_split_k = true;  // autotune: long reductions into few outputs also timed split 2-16 ways
  std::int64_t cudnn_knob_variants = 256;  // autotune: the 3 fastest cuDNN engines with one knob moved, up to this many
  std::int64_t steps_per_launch = 1;  // training steps recorded per CUDA graph launch
  // Weight gradients and updates on a second stream beside the data-gradient
  // chain (runtime/cuda/stream_plan.hpp; in a data-parallel rank too, the
  // all-reduces waiting for the gradients they read).
  bool weight_gradient_stream = true;
  // How many streams those launches spread over (0, 1 or 2). With 2, the branch
  // launches forked at one place that do not depend on one another (a
  // layer's weight gradient and its bias's column sums, the filters'
  // copies) run side by side instead of one after another. 0 (auto): two in
  // a single process, one in a data-parallel rank (the plan measured on
  // 2 GPUs); 1 or 2: that many, ranks included.
  std::int64_t gradient_streams = 0;
  bool gradient_stream_first = false;  // its kernels scheduled before the step stream's (else at the same priority)
  // Launches that depend on no earlier launch of the step (the parameter
  // casts) on that second stream from the step's start, beside the batch
  // fetch; and those computed from the parameters alone (the filters'
  // channels-last copies), forked after what they read.
  bool independent_launch_stream = true;
  // Data parallel: each bucket's all-reduce on the communication stream,
  // overlapping the backward of the layers before it (off: on the step's
  // stream where it sits in the schedule, for an A/B of the overlap).
  bool communication_stream = true;
  // Data parallel: one update launch per all-reduce bucket (the multi-tensor
  // SGD and update-rule launches split where their gradients' buckets
  // differ), each on the step's stream after its own bucket's join, so an
  // earlier bucket's update runs beside a later bucket's all-reduce (off:
  // every update in one launch after the last bucket). On by default: the
  // 8192-wide MLP on 2 H200s +20% (docs/data_parallel.md); a single process
  // has no buckets, so nothing splits there.
  bool update_per_bucket = true;
  // An update-rule update that moves 32 MB or more (a parameter of ~1M fp32
  // elements with Adam) whose gradient is complete before the step's last
  // gradient in a launch of its own, which runs on the gradient stream beside the rest of the backward
  // (off: every such update in one launch after the last gradient).
  bool large_updates_apart = true;

  // --- lowerings that may be chosen (each off: the next one in priority order)
  bool core_only = false;              // no fast path at all: the core lowerings alone (issue 35)
  bool whole_step = true;              // one kernel (a small CNN: two) for the whole step where it fits
  WholeStepMode whole_step_mode = WholeStepMode::automatic;
  bool one_pass_backward = true;       // dgrad + SGD in one pass over W; the output layer's backward in one kernel
  bool small_batch_forward = true;     // our small-batch forwards (batch fetch folded into the first)
  bool fold_input_update = true;       // the first layer's update inside the one-pass launch above it
  ConvKernels conv_kernels = ConvKernels::automatic;  // convolutions: ours, cuDNN, or each where it is faster
  ActivationLayout activation_layout = ActivationLayout::automatic;  // NCHW or channels-last convolution layers

  // --- kernel knobs
  bool dependent_launch = true;        // programmatic dependent launch on Hopper
  bool classifier_mma = true;          // the classifier forward on tensor cores (batch 256/1024)
  bool one_pass_multicast = true;      // batch-256 one-pass kernel: pairs of blocks share dY tiles
  int strip_splits = 0;                // one-pass column-strip kernel: blocks per strip (0: the measured rule)
  int resident_cluster = 0;            // resident whole-step kernel: cluster size (0: the largest that fits)
};

}  // namespace sg
