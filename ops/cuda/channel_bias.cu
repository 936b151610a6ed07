// Per-channel bias [+ ReLU] over an NCHW tensor, in place: what a cuDNN
// convolution forward needs after it when cuDNN has no fused engine for
// conv + bias [+ ReLU] at that shape.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "ops/cuda/conv_cudnn.hpp"
#include "ops/cuda/cuda_check.hpp"

namespace sg::cuda {
namespace {

template <typename T>
__global__ void channel_bias_kernel(T* y, const T* bias, std::int64_t count, std::int64_t c, std::int64_t hw, bool relu) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float v = static_cast<float>(y[i]) + static_cast<float>(bias[(i / hw) % c]);
    if (relu) v = fmaxf(v, 0.0f);
    y[i] = static_cast<T>(v);
  }
}

}  // namespace

template <typename T>
void launch_channel_bias(T* y, const T* bias, std::int64_t n, std::int64_t c, std::int64_t hw, bool relu,
                         cudaStream_t stream) {
  const std::int64_t count = n * c * hw;
  if (count == 0) return;
  constexpr int kThreads = 256;
  const auto blocks = static_cast<unsigned>(std::min<std::int64_t>((count + kThreads - 1) / kThreads, 4096));
  channel_bias_kernel<<<blocks, kThreads, 0, stream>>>(y, bias, count, c, hw, relu);
  SG_LAUNCH_CHECK("channel_bias_kernel");
}

template void launch_channel_bias<__half>(__half*, const __half*, std::int64_t, std::int64_t, std::int64_t, bool, cudaStream_t);
template void launch_channel_bias<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, std::int64_t, std::int64_t,
                                                 std::int64_t, bool, cudaStream_t);
template void launch_channel_bias<float>(float*, const float*, std::int64_t, std::int64_t, std::int64_t, bool, cudaStream_t);

}  // namespace sg::cuda
