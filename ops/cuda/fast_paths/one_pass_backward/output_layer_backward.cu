// The fused output-layer backward (output_layer_backward.hpp). A block owns
// 32 columns j of h, W and dh (a lane each) and its 8 warps split the batch:
// warp y takes rows y, y+8, ... (the order in which the column sums and the
// weight gradient add rows, so every update matches the launches this
// kernel replaces bit for bit; the reported loss is summed as a warp tree).
// A warp computes the softmax of its own rows (four at
// a time, a quarter warp each, for up to 16 classes), so no
// block waits for another and no warp waits for the others until the
// gradients' partial sums meet in shared memory. Block 0 also writes the
// loss, b_out and the step.
//
// Launched as a dependent launch (dependent_launch.cuh): W's columns, h (and
// the pre-activation z, for gelu, gelu_tanh and silu: written by the same
// earlier kernel as h), the biases and the SGD scalars are loaded while the
// classifier forward that writes the logits finishes.
#include <fmt/format.h>

#include "ops/cuda/activation.cuh"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/dependent_launch.cuh"
#include "ops/cuda/fast_paths/one_pass_backward/output_layer_backward.hpp"
#include "ops/cuda/sgd_step.cuh"
#include "ops/cuda/small_linear.hpp"
#include "ops/cuda/softmax_row.cuh"
#include "ops/cuda/warp_reduce.cuh"

namespace sg::cuda {
namespace {

constexpr int kMaxBatch = 32, kMaxClasses = 32;
// This kernel reads h before its wait. The classifier's forward writes h
// itself where it applies h's activation on its load, on its tensor-core
// tiles only (small_linear.hpp), which start above this kernel's batches.
static_assert(kMaxBatch < kTensorCoreMinRows, "the classifier's forward would write the h read before the wait");
constexpr int kColumns = 32;                       // per block: one per lane
constexpr int kRowGroups = 8;                      // warps; warp y takes rows y, y + 8, ...
constexpr int kBlockThreads = kRowGroups * 32;
constexpr int kRowsPerWarp = kMaxBatch / kRowGroups;
static_assert(kMaxBatch <= kBlockThreads, "a thread per row's label");

// Block 0's share, spread over its warps so none of them holds up the
// block: warp 0 the mean loss (a warp tree over the rows: the loss is only
// reported, and this is its one serial chain) and the step (an atomic add:
// nothing waits for it), warp 1 b_out (old value in out_bias_old, lane c)
// from the row groups' column sums of dlogits (out_bias_part[y][c]: rows y,
// y+8, ... then the 8 partials in order, the order of column_sum_kernel in
// sgd.cu), every thread dlogits for other readers.
template <int C>
__device__ void finish_outputs(const OutputLayerBackward& a, const __half* dlog, const float* row_loss,
                               const float* out_bias_part, float out_bias_old, const UpdateScalars& out_bias_sgd) {
  const int rows = int(a.batch), classes = int(a.classes), warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  static_assert(kMaxBatch <= 32, "one row's loss per lane");
  if (warp == 0) {
    const float total = warp_sum(lane < rows ? row_loss[lane] : 0.f);
    if (lane == 0) {
      *a.loss = total * (1.f / static_cast<float>(rows));
      if (a.step) atomicAdd(a.step, 1);
    }
  }
  if (warp == 1 && lane < classes) {
    float total = 0.f;
#pragma unroll
    for (int y = 0; y < kRowGroups; ++y) total += out_bias_part[y * C + lane];
    a.out_bias[lane] = __float2half(sgd_step(out_bias_old, total, nullptr, out_bias_sgd));
  }
  if (a.dlogits)
    for (int e = threadIdx.x; e < rows * classes; e += kBlockThreads) a.dlogits[e] = dlog[e];
}

// Warp y's column sums of dlogits over its rows y, y+8, ... (lane c < classes).
template <int C>
__device__ void row_group_column_sums(const OutputLayerBackward& a, const __half* dlog, float* out_bias_part) {
  const int rows = int(a.batch), classes = int(a.classes), warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane >= classes) return;
  float partial = 0.f;
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = warp + i * kRowGroups;
    if (r < rows) partial += __half2float(dlog[r * classes + lane]);
  }
  out_bias_part[warp * C + lane] = partial;
}

// C: the number of classes when the instance is for exactly that many (no
// guards in the unrolled class loops: MNIST's 10), or kMaxClasses for any
// count up to it. A: the activation that produced h.
template <int C, Activation A>
__global__ void __launch_bounds__(kBlockThreads)
    output_layer_backward_kernel(OutputLayerBackward a, const __half* pre_activation) {
  constexpr int kLd = (C + 3) / 4 * 4;  // dlog_f rows: 16-byte aligned for float4 reads
  __shared__ __half logits[kMaxBatch * C], dlog[kMaxBatch * C];
  __shared__ __align__(16) float dlog_f[kMaxBatch * kLd];
  __shared__ float row_loss[kMaxBatch];
  __shared__ float out_bias_part[kRowGroups * C];            // block 0: [warp][c] column sums of dlogits
  __shared__ std::int32_t labels[kMaxBatch];
  __shared__ float w_tile[C * kColumns];                       // W[c, col0 + lane]
  __shared__ float grad_part[kRowGroups * C * kColumns];       // [warp][c][lane]
  __shared__ float column_part[kRowGroups * kColumns];         // [warp][lane]
  allow_next_kernel_to_start();
  const int rows = int(a.batch), classes = int(a.classes), hidden = int(a.hidden);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int col0 = blockIdx.x * kColumns, j = col0 + lane;
  const bool mine = j < hidden;
  const auto live = [&](int c) { return C != kMaxClasses || c < classes; };

  // Before the wait: only W and h, which the classifier forward does not write.
  for (int e = threadIdx.x; e < C * kColumns; e += kBlockThreads) {
    const int c = e / kColumns, col = col0 + e % kColumns;
    w_tile[e] = live(c) && col < hidden ? __half2float(a.w[std::int64_t(c) * hidden + col]) : 0.f;
  }
  float hv[kRowsPerWarp];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = warp + i * kRowGroups;
    hv[i] = mine && r < rows ? __half2float(a.h[std::int64_t(r) * hidden + j]) : 0.f;
  }
  // What the activation's backward reads: h itself, or (gelu, gelu_tanh,
  // silu) the pre-activation z, written by the same earlier kernel as h.
  constexpr bool kReadsZ = kBackwardReadsInput<A>;
  float zv[kReadsZ ? kRowsPerWarp : 1];
  if constexpr (kReadsZ) {
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int r = warp + i * kRowGroups;
      zv[i] = mine && r < rows ? __half2float(pre_activation[std::int64_t(r) * hidden + j]) : 0.f;
    }
  }
  // (The biases and scalars too: only this kernel writes the biases, in the previous step.)
  const UpdateScalars ws = *a.w_sgd, hs = *a.hidden_bias_sgd, os = *a.out_bias_sgd;
  const bool updates_hidden_bias = warp == kRowGroups - 1 && mine;
  const float hidden_bias = updates_hidden_bias ? __half2float(a.hidden_bias[j]) : 0.f;
  const float out_bias = blockIdx.x == 0 && warp == 1 && lane < classes ? __half2float(a.out_bias[lane]) : 0.f;
  wait_for_previous_kernel();

  // Every row's logits and label into shared memory, the block's threads
  // together, every load in flight before the first store: one round trip
  // (a warp copying its own rows waited for each in turn: 4 round trips).
  // Then each warp's softmaxes.
  constexpr int kLogitsPerThread = (kMaxBatch * C + kBlockThreads - 1) / kBlockThreads;
  const int logit_count = rows * classes;
  __half logit_v[kLogitsPerThread];
#pragma unroll
  for (int q = 0; q < kLogitsPerThread; ++q) {
    const int e = threadIdx.x + q * kBlockThreads;
    logit_v[q] = e < logit_count ? a.logits[e] : __half();
  }
  const std::int32_t label = threadIdx.x < rows ? a.labels[threadIdx.x] : 0;
#pragma unroll
  for (int q = 0; q < kLogitsPerThread; ++q) {
    const int e = threadIdx.x + q * kBlockThreads;
    if (e < logit_count) logits[(e / classes) * C + e % classes] = logit_v[q];
  }
  if (threadIdx.x < rows) labels[threadIdx.x] = label;
  __syncthreads();
  const float inv_rows = 1.f / static_cast<float>(rows);
  if constexpr (C <= 16) {
    // Four rows at a time, one per quarter warp: the bits of a whole warp's
    // row (softmax_row.cuh). A quarter without a row of its own redoes the
    // warp's first one without writing.
    const int quarter = lane / 8, quarter_lane = lane % 8;
    for (int r0 = warp; r0 < rows; r0 += 4 * kRowGroups) {
      const int own = r0 + quarter * kRowGroups;
      const bool writes = own < rows;
      const int r = writes ? own : r0;
      const float loss =
          softmax_xent_lanes<8>(logits + r * C, classes, labels[r], inv_rows, writes ? dlog + r * classes : nullptr);
      if (writes && quarter_lane == 0) row_loss[r] = loss;
      __syncwarp();
      if (writes)
        for (int c = quarter_lane; c < classes; c += 8) dlog_f[r * kLd + c] = __half2float(dlog[r * classes + c]);
    }
  } else {
    for (int r = warp; r < rows; r += kRowGroups) {
      const float loss = softmax_xent_row(logits + r * C, classes, labels[r], inv_rows, dlog + r * classes);
      if (lane == 0) row_loss[r] = loss;
      __syncwarp();
      if (lane < classes) dlog_f[r * kLd + lane] = __half2float(dlog[r * classes + lane]);
    }
  }
  if (blockIdx.x == 0) {
    __syncwarp();  // this warp's rows of dlog
    row_group_column_sums<C>(a, dlog, out_bias_part);
  }
  __syncthreads();  // w_tile; and block 0 reads every warp's rows
  if (blockIdx.x == 0) finish_outputs<C>(a, dlog, row_loss, out_bias_part, out_bias, os);

  float w[C];
#pragma unroll
  for (int c = 0; c < C; ++c) w[c] = w_tile[c * kColumns + lane];
  float grad[C];
#pragma unroll
  for (int c = 0; c < C; ++c) grad[c] = 0.f;
  float column = 0.f;
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = warp + i * kRowGroups;
    if (r >= rows) break;
    float d[kLd];
#pragma unroll
    for (int q = 0; q < kLd / 4; ++q)
      *reinterpret_cast<float4*>(d + 4 * q) = *reinterpret_cast<const float4*>(dlog_f + r * kLd + 4 * q);
    float s = 0.f;
#pragma unroll
    for (int c = 0; c < C; ++c)
      if (live(c)) s += d[c] * w[c];
    __half dh;
    if constexpr (A == Activation::relu)  // (the select this kernel always made: the ReLU instance is unchanged)
      dh = hv[i] > 0.f ? __float2half(s) : __float2half(0.f);
    else
      dh = __float2half(ActivationMath<A>::backward(s, kReadsZ ? zv[i] : hv[i]));
    if (mine) a.dh[std::int64_t(r) * hidden + j] = dh;
    column += __half2float(dh);
#pragma unroll
    for (int c = 0; c < C; ++c)
      if (live(c)) grad[c] += d[c] * hv[i];
  }
#pragma unroll
  for (int c = 0; c < C; ++c) grad_part[(warp * C + c) * kColumns + lane] = grad[c];
  column_part[warp * kColumns + lane] = column;
  __syncthreads();

  // The 8 row groups' partials, added in group order: W's update...
  for (int e = threadIdx.x; e < C * kColumns; e += kBlockThreads) {
    const int c = e / kColumns, col = col0 + e % kColumns;
    if (!live(c) || col >= hidden) continue;
    float total = 0.f;
#pragma unroll
    for (int y = 0; y < kRowGroups; ++y) total += grad_part[y * C * kColumns + e];
    a.w[std::int64_t(c) * hidden + col] = __float2half(ws.neg_lr * total + ws.one_minus_lr_wd * w_tile[e]);
  }
  // ...and b_h's.
  if (updates_hidden_bias) {
    float total = 0.f;
#pragma unroll
    for (int y = 0; y < kRowGroups; ++y) total += column_part[y * kColumns + lane];
    a.hidden_bias[j] = __float2half(sgd_step(hidden_bias, total, nullptr, hs));
  }
}

}  // namespace

std::string output_layer_backward_unsupported(std::int64_t batch, std::int64_t classes, std::int64_t hidden) {
  if (batch < 1 || batch > kMaxBatch) return fmt::format("batch {} (1..{} supported)", batch, kMaxBatch);
  if (classes < 1 || classes > kMaxClasses) return fmt::format("{} classes (1..{} supported)", classes, kMaxClasses);
  if (hidden < 1 || hidden > (std::int64_t(1) << 30)) return fmt::format("hidden width {}", hidden);
  return {};
}

void launch_output_layer_backward(const OutputLayerBackward& args, cudaStream_t stream, bool dependent,
                                  const OutputLayerActivation& activation) {
  if (const std::string why = output_layer_backward_unsupported(args.batch, args.classes, args.hidden); !why.empty())
    throw CudaError("output_layer_backward_kernel: unsupported: " + why);
  if (backward_reads_input(activation.activation) && !activation.pre_activation)
    throw CudaError("output_layer_backward_kernel: the activation's backward needs the pre-activation");
  const dim3 blocks(static_cast<unsigned>((args.hidden + kColumns - 1) / kColumns));
  const __half* z = activation.pre_activation;
  with_activation(activation.activation, [&](auto act) {
    constexpr Activation A = decltype(act)::value;
    if (args.classes == 10)
      launch_dependent(output_layer_backward_kernel<10, A>, {blocks, dim3(kBlockThreads)}, stream, dependent, args, z);
    else
      launch_dependent(output_layer_backward_kernel<kMaxClasses, A>, {blocks, dim3(kBlockThreads)}, stream, dependent,
                       args, z);
  });
}

}  // namespace sg::cuda
