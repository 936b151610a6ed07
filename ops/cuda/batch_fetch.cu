// The in-graph batch fetch: one block per batch row reads the row index from
// the permutation at the device-side step counter, then copies that image
// row (u8, 16 pixels per load) scaled to the compute dtype, and its label.
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/kernels.hpp"
#include "ops/cuda/launch_config.cuh"
#include "ops/cuda/scaled_pixel.cuh"

namespace sg::cuda {
namespace {

template <typename T>
__global__ void batch_fetch_kernel(const std::int32_t* perm, std::int64_t n, const std::int32_t* step,
                                   std::int64_t batch, const std::uint8_t* images, std::int64_t cols, float scale,
                                   float shift, T* x_out, const std::uint8_t* labels, std::int32_t* labels_out,
                                   bool vectorised, std::int64_t rank, std::int64_t ranks) {
  const std::int64_t i = blockIdx.x;
  const std::int64_t global = batch * ranks;  // this rank's slice of the global batch (ranks 1: the batch)
  const std::int64_t batches_per_epoch = n / global;
  const std::int64_t row = perm[(static_cast<std::int64_t>(*step) % batches_per_epoch) * global + rank * batch + i];
  const std::uint8_t* src = images + row * cols;
  T* dst = x_out + i * cols;
  if (threadIdx.x == 0) labels_out[i] = labels[row];
  if (vectorised) {
    // 16 pixels per 16-byte load; written as 16 / kVec<T> vector stores.
    for (std::int64_t c = threadIdx.x * 16; c < cols; c += blockDim.x * 16) {
      const uint4 packed = *reinterpret_cast<const uint4*>(src + c);
      const auto* bytes = reinterpret_cast<const std::uint8_t*>(&packed);
      Vec16<T> out[16 / kVec<T>];
#pragma unroll
      for (int k = 0; k < 16; ++k) out[k / kVec<T>].v[k % kVec<T>] = scaled_pixel<T>(bytes[k], scale, shift);
#pragma unroll
      for (int k = 0; k < 16 / kVec<T>; ++k) reinterpret_cast<Vec16<T>*>(dst + c)[k] = out[k];
    }
  } else {
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = scaled_pixel<T>(src[c], scale, shift);
  }
}

template <typename T>
void fetch(const std::int32_t* perm, std::int64_t n, const std::int32_t* step, std::int64_t batch,
           const std::uint8_t* images, std::int64_t cols, float scale, float shift, T* x_out,
           const std::uint8_t* labels, std::int32_t* labels_out, cudaStream_t stream, std::int64_t rank,
           std::int64_t ranks) {
  const bool vectorised = cols % 16 == 0 && aligned16(images) && aligned16(x_out);
  const int threads = vectorised ? 64 : 256;
  batch_fetch_kernel<T><<<static_cast<unsigned>(batch), threads, 0, stream>>>(
      perm, n, step, batch, images, cols, scale, shift, x_out, labels, labels_out, vectorised, rank, ranks);
  SG_LAUNCH_CHECK("batch_fetch_kernel");
}

__global__ void advance_step_kernel(std::int32_t* step) { *step += 1; }

}  // namespace

void launch_batch_fetch(const std::int32_t* perm, std::int64_t n, const std::int32_t* step, std::int64_t batch,
                        const std::uint8_t* images, std::int64_t cols, float scale, float shift, __half* x_out,
                        const std::uint8_t* labels, std::int32_t* labels_out, cudaStream_t stream, std::int64_t rank, std::int64_t ranks) {
  fetch(perm, n, step, batch, images, cols, scale, shift, x_out, labels, labels_out, stream, rank, ranks);
}

void launch_batch_fetch(const std::int32_t* perm, std::int64_t n, const std::int32_t* step, std::int64_t batch,
                        const std::uint8_t* images, std::int64_t cols, float scale, float shift, float* x_out,
                        const std::uint8_t* labels, std::int32_t* labels_out, cudaStream_t stream, std::int64_t rank, std::int64_t ranks) {
  fetch(perm, n, step, batch, images, cols, scale, shift, x_out, labels, labels_out, stream, rank, ranks);
}

void launch_batch_fetch(const std::int32_t* perm, std::int64_t n, const std::int32_t* step, std::int64_t batch,
                        const std::uint8_t* images, std::int64_t cols, float scale, float shift,
                        __nv_bfloat16* x_out, const std::uint8_t* labels, std::int32_t* labels_out,
                        cudaStream_t stream, std::int64_t rank, std::int64_t ranks) {
  fetch(perm, n, step, batch, images, cols, scale, shift, x_out, labels, labels_out, stream, rank, ranks);
}

void launch_advance_step(std::int32_t* step, cudaStream_t stream) {
  advance_step_kernel<<<1, 1, 0, stream>>>(step);
  SG_LAUNCH_CHECK("advance_step_kernel");
}

void launch_poison(void* data, std::size_t bytes, cudaStream_t stream) {
  // 0xFF bytes are NaN in f16 and bf16 (0xFFFF) and in f32 (0xFFFFFFFF).
  SG_CUDA_CHECK(cudaMemsetAsync(data, 0xFF, bytes, stream));
}

}  // namespace sg::cuda
