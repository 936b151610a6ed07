// Loss kernels. The training loss is one launch of several blocks: block 0
// sums the loss, one thread per row (rows t, t + 256, ...), the per-thread
// sums added as a fixed tree, so the reported loss is bit-reproducible (no
// atomics); the other blocks write dlogits, a warp per row, so no warp walks
// a long chain of rows (one block of 32 warps took 42 us at batch 1024).
// Argmax hits are one block of 32 warps (evaluation only).
#include <algorithm>
#include <cfloat>

#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/dependent_launch.cuh"
#include "ops/cuda/kernels.hpp"
#include "ops/cuda/launch_config.cuh"
#include "ops/cuda/softmax_row.cuh"
#include "ops/cuda/warp_reduce.cuh"

namespace sg::cuda {
namespace {

constexpr int kWarps = 32;             // count_correct's block
constexpr int kXentWarps = 8;          // per block of the loss kernel
constexpr int kXentThreads = kXentWarps * 32;
constexpr unsigned kMaxGradientBlocks = 4096;

template <typename T>
__global__ void __launch_bounds__(kXentThreads) softmax_xent_kernel(const T* logits, const std::int32_t* labels,
                                                                    std::int64_t rows, std::int64_t cols, float* loss,
                                                                    T* dlogits, float gradient_scale) {
  wait_for_previous_kernel();  // (a dependent launch: the logits come from the kernel before)
  allow_next_kernel_to_start();
  if (blockIdx.x == 0) {
    float partial = 0.f;
    for (std::int64_t r = threadIdx.x; r < rows; r += kXentThreads)
      partial += row_loss_by_thread(logits + r * cols, cols, labels[r]);
    block_total<kXentWarps>(warp_sum(partial), loss, 1.f / static_cast<float>(rows));
    return;
  }
  // dlogits: the bits of softmax_xent_row, which the fused output-layer backward shares.
  const std::int64_t warps = std::int64_t(gridDim.x - 1) * kXentWarps;
  const float inv_rows = gradient_scale / static_cast<float>(rows);  // (1/N in a rank of N: exact for N = 2^k)
  for (std::int64_t r = std::int64_t(blockIdx.x - 1) * kXentWarps + threadIdx.x / 32; r < rows; r += warps)
    softmax_xent_row(logits + r * cols, cols, labels[r], inv_rows, dlogits + r * cols);
}

template <typename T>
__global__ void count_correct_kernel(const T* logits, const std::int32_t* labels, std::int64_t rows, std::int64_t cols,
                                     std::int32_t* correct) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float hits = 0.f;
  for (std::int64_t r = warp; r < rows; r += kWarps) {
    const T* row = logits + r * cols;
    float best = -FLT_MAX;
    std::int64_t best_col = cols;
    for (std::int64_t c = lane; c < cols; c += 32) {
      const float v = to_float(row[c]);
      if (v > best) {
        best = v;
        best_col = c;
      }
    }
    // First maximal column across lanes: larger value wins, ties go to the smaller index.
    for (int o = 16; o > 0; o /= 2) {
      const float other = __shfl_xor_sync(0xffffffffu, best, o);
      const std::int64_t other_col = __shfl_xor_sync(0xffffffffu, best_col, o);
      if (other > best || (other == best && other_col < best_col)) {
        best = other;
        best_col = other_col;
      }
    }
    if (lane == 0) hits += best_col == labels[r] ? 1.f : 0.f;
  }
  block_total<kWarps>(hits, correct, 1.f);
}

}  // namespace

template <typename T>
void launch_softmax_xent(const T* logits, const std::int32_t* labels, std::int64_t rows, std::int64_t cols, float* loss,
                         T* dlogits, cudaStream_t stream, bool dependent, float gradient_scale) {
  // Block 0 the loss; with dlogits, a warp per row in the blocks after it.
  const unsigned gradient_blocks =
      dlogits ? static_cast<unsigned>(std::min<std::int64_t>((rows + kXentWarps - 1) / kXentWarps, kMaxGradientBlocks)) : 0;
  launch_dependent(softmax_xent_kernel<T>, {dim3(1 + gradient_blocks), dim3(kXentThreads)}, stream, dependent, logits,
                   labels, rows, cols, loss, dlogits, gradient_scale);
}

template <typename T>
void launch_count_correct(const T* logits, const std::int32_t* labels, std::int64_t rows, std::int64_t cols,
                          std::int32_t* correct, cudaStream_t stream) {
  count_correct_kernel<<<1, kWarps * 32, 0, stream>>>(logits, labels, rows, cols, correct);
  SG_LAUNCH_CHECK("count_correct_kernel");
}

template void launch_softmax_xent<float>(const float*, const std::int32_t*, std::int64_t, std::int64_t, float*, float*,
                                          cudaStream_t, bool, float);
template void launch_softmax_xent<__half>(const __half*, const std::int32_t*, std::int64_t, std::int64_t, float*,
                                          __half*, cudaStream_t, bool, float);
template void launch_count_correct<float>(const float*, const std::int32_t*, std::int64_t, std::int64_t, std::int32_t*, cudaStream_t);
template void launch_count_correct<__half>(const __half*, const std::int32_t*, std::int64_t, std::int64_t, std::int32_t*, cudaStream_t);
template void launch_softmax_xent<__nv_bfloat16>(const __nv_bfloat16*, const std::int32_t*, std::int64_t, std::int64_t,
                                                  float*, __nv_bfloat16*, cudaStream_t, bool, float);
template void launch_count_correct<__nv_bfloat16>(const __nv_bfloat16*, const std::int32_t*, std::int64_t, std::int64_t, std::int32_t*, cudaStream_t);

}  // namespace sg::cuda
