// Loss kernels. One block of 32 warps; warp w takes rows w, w+32, ...; each
// warp keeps its own partial sum and the block adds the 32 partials in a
// fixed order, so the loss is bit-reproducible (no atomics).
#include <cfloat>

#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/kernels.hpp"
#include "ops/cuda/launch_config.cuh"
#include "ops/cuda/softmax_row.cuh"

namespace sg::cuda {
namespace {

constexpr int kWarps = 32;

// Adds the per-warp partials in warp order and stores the result from thread 0.
template <typename Out>
__device__ void block_total(float warp_partial, Out* out, float scale) {
  __shared__ float partials[kWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) partials[warp] = warp_partial;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.f;
    for (int w = 0; w < kWarps; ++w) total += partials[w];
    *out = static_cast<Out>(total * scale);
  }
}

template <typename T>
__global__ void softmax_xent_kernel(const T* logits, const std::int32_t* labels, std::int64_t rows, std::int64_t cols,
                                    float* loss, T* dlogits) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float partial = 0.f;
  const float inv_rows = 1.f / static_cast<float>(rows);
  for (std::int64_t r = warp; r < rows; r += kWarps) {
    const float row_loss =
        softmax_xent_row(logits + r * cols, cols, labels[r], inv_rows, dlogits ? dlogits + r * cols : nullptr);
    if (lane == 0) partial += row_loss;
  }
  block_total(partial, loss, 1.f / static_cast<float>(rows));
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
  __shared__ float partials[kWarps];
  if (lane == 0) partials[warp] = hits;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.f;
    for (int w = 0; w < kWarps; ++w) total += partials[w];
    *correct = static_cast<std::int32_t>(total);
  }
}

}  // namespace

template <typename T>
void launch_softmax_xent(const T* logits, const std::int32_t* labels, std::int64_t rows, std::int64_t cols, float* loss,
                         T* dlogits, cudaStream_t stream) {
  softmax_xent_kernel<<<1, kWarps * 32, 0, stream>>>(logits, labels, rows, cols, loss, dlogits);
  SG_LAUNCH_CHECK("softmax_xent_kernel");
}

template <typename T>
void launch_count_correct(const T* logits, const std::int32_t* labels, std::int64_t rows, std::int64_t cols,
                          std::int32_t* correct, cudaStream_t stream) {
  count_correct_kernel<<<1, kWarps * 32, 0, stream>>>(logits, labels, rows, cols, correct);
  SG_LAUNCH_CHECK("count_correct_kernel");
}

template void launch_softmax_xent<float>(const float*, const std::int32_t*, std::int64_t, std::int64_t, float*, float*, cudaStream_t);
template void launch_softmax_xent<__half>(const __half*, const std::int32_t*, std::int64_t, std::int64_t, float*, __half*, cudaStream_t);
template void launch_count_correct<float>(const float*, const std::int32_t*, std::int64_t, std::int64_t, std::int32_t*, cudaStream_t);
template void launch_count_correct<__half>(const __half*, const std::int32_t*, std::int64_t, std::int64_t, std::int32_t*, cudaStream_t);

}  // namespace sg::cuda
