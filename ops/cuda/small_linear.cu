// CUDA-core kernels for the classifier layer's matmuls (see small_linear.hpp).
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/dependent_launch.cuh"
#include "ops/cuda/launch_config.cuh"
#include "ops/cuda/small_linear.hpp"
#include "ops/cuda/warp_reduce.cuh"

namespace sg::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

// Output (r, c) = dot(x row r, w row c): lanes stride K, two halves a load
// when both rows are 4-byte aligned (K even), else one.
__global__ void linear_small_n_kernel(const __half* x, const __half* w, const __half* bias, std::int64_t m,
                                      std::int64_t n, std::int64_t k, __half* y) {
  // A dependent launch: x comes from the kernel before. The output-layer
  // backward that follows is one too; it may start once x's writer is
  // complete (its loads of h need that), and waits for these logits.
  const std::int64_t out = std::int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  // (the bias before the wait: the kernels before this one do not write it)
  const float b = out < m * n ? __half2float(bias[out % n]) : 0.f;
  wait_for_previous_kernel();
  allow_next_kernel_to_start();
  if (out >= m * n) return;  // whole warps leave together
  const std::int64_t r = out / n, c = out % n;
  const __half* xr = x + r * k;
  const __half* wc = w + c * k;
  float s = 0.f;
  if (k % 2 == 0) {
    const auto* x2 = reinterpret_cast<const __half2*>(xr);
    const auto* w2 = reinterpret_cast<const __half2*>(wc);
#pragma unroll 4
    for (std::int64_t i = lane; i < k / 2; i += 32) {
      const float2 a = __half22float2(x2[i]), b = __half22float2(w2[i]);
      s += a.x * b.x + a.y * b.y;
    }
  } else {
#pragma unroll 4
    for (std::int64_t i = lane; i < k; i += 32) s += __half2float(xr[i]) * __half2float(wc[i]);
  }
  s = warp_sum(s);
  if (lane == 0) y[out] = __float2half(s + b);
}

template <typename W>
__global__ void wgrad_sgd_small_m_kernel(const __half* dy, const __half* x, std::int64_t batch, std::int64_t m,
                                         std::int64_t k, W* w, const SgdScalars* scalars) {
  const SgdScalars s = *scalars;
  for (std::int64_t e = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; e < m * k;
       e += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t row = e / k, col = e % k;
    // Rows b = y, y+8, ... per y, then the 8 partials in order: the order of
    // the fused output-layer backward, whose warp y takes those rows.
    float g = 0.f;
#pragma unroll
    for (int y = 0; y < 8; ++y) {
      float partial = 0.f;
      for (std::int64_t b = y; b < batch; b += 8) partial += __half2float(dy[b * m + row]) * __half2float(x[b * k + col]);
      g += partial;
    }
    w[e] = from_float<W>(s.neg_lr * g + s.one_minus_lr_wd * to_float(w[e]));
  }
}

__global__ void dgrad_relu_small_k_kernel(const __half* dy, const __half* w, const __half* relu_out, std::int64_t m,
                                          std::int64_t n, std::int64_t k, __half* dx) {
  for (std::int64_t e = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; e < m * n;
       e += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t r = e / n, col = e % n;
    float s = 0.f;
#pragma unroll 8
    for (std::int64_t c = 0; c < k; ++c) s += __half2float(dy[r * k + c]) * __half2float(w[c * n + col]);
    dx[e] = __half2float(relu_out[e]) > 0.f ? __float2half(s) : __float2half(0.f);
  }
}

}  // namespace

void launch_dgrad_relu_small_k(const __half* dy, const __half* w, const __half* relu_out, std::int64_t m,
                               std::int64_t n, std::int64_t k, __half* dx, cudaStream_t stream) {
  if (k > kSmallLinearMaxDim) throw CudaError("dgrad_relu_small_k_kernel: K above its limit");
  dgrad_relu_small_k_kernel<<<blocks_for(m * n), kThreads, 0, stream>>>(dy, w, relu_out, m, n, k, dx);
  SG_LAUNCH_CHECK("dgrad_relu_small_k_kernel");
}

void launch_linear_small_n(const __half* x, const __half* w, const __half* bias, std::int64_t m, std::int64_t n,
                           std::int64_t k, __half* y, cudaStream_t stream) {
  if (n > kSmallLinearMaxDim) throw CudaError("linear_small_n_kernel: N above its limit");
  const std::int64_t blocks = (m * n + kWarpsPerBlock - 1) / kWarpsPerBlock;
  launch_dependent(linear_small_n_kernel, {dim3(static_cast<unsigned>(blocks)), dim3(kWarpsPerBlock * 32)}, stream, x, w,
                   bias, m, n, k, y);
}

template <typename W>
void launch_wgrad_sgd_small_m(const __half* dy, const __half* x, std::int64_t batch, std::int64_t m, std::int64_t k,
                              W* w, const SgdScalars* scalars, cudaStream_t stream) {
  if (m > kSmallLinearMaxDim) throw CudaError("wgrad_sgd_small_m_kernel: M above its limit");
  wgrad_sgd_small_m_kernel<W><<<blocks_for(m * k), kThreads, 0, stream>>>(dy, x, batch, m, k, w, scalars);
  SG_LAUNCH_CHECK("wgrad_sgd_small_m_kernel");
}

template void launch_wgrad_sgd_small_m<__half>(const __half*, const __half*, std::int64_t, std::int64_t, std::int64_t,
                                               __half*, const SgdScalars*, cudaStream_t);
template void launch_wgrad_sgd_small_m<float>(const __half*, const __half*, std::int64_t, std::int64_t, std::int64_t,
                                              float*, const SgdScalars*, cudaStream_t);

}  // namespace sg::cuda
