// The fused output-layer backward (output_layer_backward.hpp). Every block
// recomputes the (tiny) softmax of the whole batch into shared memory, so no
// block waits for another; then each thread owns one column j of h, W and
// dh: it holds W[:, j] in registers, walks the batch once for dh[:, j], the
// column sums behind b_h[j] and the gradient of W[:, j], and updates both.
// Block 0 also writes the loss, b_out and the step.
#include <fmt/format.h>

#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/output_layer_backward.hpp"
#include "ops/cuda/sgd_step.cuh"
#include "ops/cuda/softmax_row.cuh"

namespace sg::cuda {
namespace {

constexpr int kMaxBatch = 32, kMaxClasses = 32;  // (batch 32: h for all rows fits shared memory)
// Columns (threads) per block. Each block recomputes the softmax, a row per
// warp at a time, and each thread walks the batch for its column: the time
// is those serial chains, so 8 warps (4 softmax rows each at batch 32).
constexpr int kBlockThreads = 256;
// Column sums add rows r = y, y+8, ... per y, then the 8 partials in order:
// the order of column_sum_kernel (sgd.cu), whose launches this one replaces.
constexpr int kRowGroups = 8;

// The mean loss in softmax_xent_kernel's order: 32 warp partials (rows w,
// w+32, ...), added in warp order.
__device__ float mean_loss(const float* row_loss, int rows) {
  float total = 0.f;
  for (int w = 0; w < 32; ++w) {
    float partial = 0.f;
    for (int r = w; r < rows; r += 32) partial += row_loss[r];
    total += partial;
  }
  return total * (1.f / static_cast<float>(rows));
}

// Block 0's share: the loss, dlogits for other readers, b_out, the step.
__device__ void finish_outputs(const OutputLayerBackward& a, const __half* dlog, const float* row_loss) {
  const int rows = int(a.batch), classes = int(a.classes);
  if (threadIdx.x == 0) {
    *a.loss = mean_loss(row_loss, rows);
    if (a.step) *a.step += 1;
  }
  if (a.dlogits)
    for (int e = threadIdx.x; e < rows * classes; e += kBlockThreads) a.dlogits[e] = dlog[e];
  if (threadIdx.x < classes) {
    const int c = threadIdx.x;
    float total = 0.f;
    for (int y = 0; y < kRowGroups; ++y) {
      float partial = 0.f;
      for (int r = y; r < rows; r += kRowGroups) partial += __half2float(dlog[r * classes + c]);
      total += partial;
    }
    a.out_bias[c] = __float2half(sgd_step(__half2float(a.out_bias[c]), total, nullptr, *a.out_bias_sgd));
  }
}

// C: the number of classes when the instance is for exactly that many (no
// guards in the unrolled class loops: MNIST's 10), or kMaxClasses for any
// count up to it.
template <int C>
__global__ void __launch_bounds__(kBlockThreads, 1) output_layer_backward_kernel(OutputLayerBackward a) {
  __shared__ __half dlog[kMaxBatch * kMaxClasses];
  __shared__ __align__(16) float dlog_f[kMaxBatch * kMaxClasses];  // the same values as floats, rows kMaxClasses apart
  __shared__ float row_loss[kMaxBatch];
  const int rows = int(a.batch), classes = int(a.classes), hidden = int(a.hidden);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Every global load the block needs is issued here, together, so the
  // kernel waits on memory once, not once per dependent step: the logits and
  // labels (the softmaxes then run on shared memory), this block's columns of
  // h for all rows, this thread's column of W, its bias and the scalars.
  __shared__ __half logits[kMaxBatch * kMaxClasses];
  __shared__ std::int32_t labels[kMaxBatch];
  __shared__ __half h_tile[kMaxBatch * kBlockThreads];
  const auto live = [&](int c) { return C != kMaxClasses || c < classes; };
  for (int e = threadIdx.x; e < rows * classes; e += kBlockThreads) logits[e] = a.logits[e];
  for (int r = threadIdx.x; r < rows; r += kBlockThreads) labels[r] = a.labels[r];
  const int j = blockIdx.x * kBlockThreads + threadIdx.x;
  const bool mine = j < hidden;
  float w[C];
#pragma unroll
  for (int c = 0; c < C; ++c) w[c] = mine && live(c) ? __half2float(a.w[std::int64_t(c) * hidden + j]) : 0.f;
  const float hidden_bias = mine ? __half2float(a.hidden_bias[j]) : 0.f;
  const SgdScalars ws = *a.w_sgd, hs = *a.hidden_bias_sgd;
#pragma unroll
  for (int r = 0; r < kMaxBatch; ++r)
    if (mine && r < rows) h_tile[r * kBlockThreads + threadIdx.x] = a.h[std::int64_t(r) * hidden + j];
  __syncthreads();
  const float inv_rows = 1.f / static_cast<float>(rows);
  for (int r = warp; r < rows; r += kBlockThreads / 32) {
    const float loss = softmax_xent_row(logits + r * classes, classes, labels[r], inv_rows, dlog + r * classes);
    if (lane == 0) row_loss[r] = loss;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < rows * classes; e += kBlockThreads)
    dlog_f[(e / classes) * kMaxClasses + e % classes] = __half2float(dlog[e]);
  if (blockIdx.x == 0) finish_outputs(a, dlog, row_loss);
  __syncthreads();

  if (!mine) return;
  float grad[C];
#pragma unroll
  for (int c = 0; c < C; ++c) grad[c] = 0.f;
  float column[kRowGroups] = {};
  // The rows 8 at a time (the column sums' groups); the outer loop stays rolled to keep the code small.
#pragma unroll 1
  for (int r0 = 0; r0 < rows; r0 += kRowGroups)
#pragma unroll
    for (int y = 0; y < kRowGroups; ++y) {
      const int r = r0 + y;
      if (r >= rows) break;
      // dlogits of row r, four at a time (rows are 16-byte aligned)
      float d[(C + 3) / 4 * 4];
#pragma unroll
      for (int q = 0; q < (C + 3) / 4; ++q)
        *reinterpret_cast<float4*>(d + 4 * q) = *reinterpret_cast<const float4*>(dlog_f + r * kMaxClasses + 4 * q);
      const float hv = __half2float(h_tile[r * kBlockThreads + threadIdx.x]);
      float s = 0.f;
#pragma unroll
      for (int c = 0; c < C; ++c)
        if (live(c)) s += d[c] * w[c];
      const __half dh = hv > 0.f ? __float2half(s) : __float2half(0.f);
      a.dh[std::int64_t(r) * hidden + j] = dh;
      column[y] += __half2float(dh);
#pragma unroll
      for (int c = 0; c < C; ++c)
        if (live(c)) grad[c] += d[c] * hv;
    }
#pragma unroll
  for (int c = 0; c < C; ++c)
    if (live(c)) a.w[std::int64_t(c) * hidden + j] = __float2half(ws.neg_lr * grad[c] + ws.one_minus_lr_wd * w[c]);
  float total = 0.f;
#pragma unroll
  for (int y = 0; y < kRowGroups; ++y) total += column[y];
  a.hidden_bias[j] = __float2half(sgd_step(hidden_bias, total, nullptr, hs));
}

}  // namespace

std::string output_layer_backward_unsupported(std::int64_t batch, std::int64_t classes, std::int64_t hidden) {
  if (batch < 1 || batch > kMaxBatch) return fmt::format("batch {} (1..{} supported)", batch, kMaxBatch);
  if (classes < 1 || classes > kMaxClasses) return fmt::format("{} classes (1..{} supported)", classes, kMaxClasses);
  if (hidden < 1 || hidden > (std::int64_t(1) << 30)) return fmt::format("hidden width {}", hidden);
  return {};
}

void launch_output_layer_backward(const OutputLayerBackward& args, cudaStream_t stream) {
  if (const std::string why = output_layer_backward_unsupported(args.batch, args.classes, args.hidden); !why.empty())
    throw CudaError("output_layer_backward_kernel: unsupported: " + why);
  const auto blocks = static_cast<unsigned>((args.hidden + kBlockThreads - 1) / kBlockThreads);
  if (args.classes == 10)
    output_layer_backward_kernel<10><<<blocks, kBlockThreads, 0, stream>>>(args);
  else
    output_layer_backward_kernel<kMaxClasses><<<blocks, kBlockThreads, 0, stream>>>(args);
  SG_LAUNCH_CHECK("output_layer_backward_kernel");
}

}  // namespace sg::cuda
