// Dropout: one thread per group of four elements, which one Philox4x32-10
// call serves (the CPU reference draws element i from word i % 4 of block
// i / 4, so both backends keep the same elements). The step comes from the
// device step counter, so a captured graph replays with the current step.
#include "ops/cuda/dropout.hpp"

#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/launch_config.cuh"
#include "ops/philox.hpp"

namespace sg::cuda {
namespace {

template <typename T>
__global__ void dropout_kernel(const T* x, const std::int32_t* step_counter, std::int64_t n, DropoutParams p, T* y) {
  const std::int32_t step = *step_counter;
  const std::int64_t blocks = (n + 3) / 4;
  for (std::int64_t b = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; b < blocks;
       b += std::int64_t(gridDim.x) * blockDim.x) {
    const philox::Bits4 r = philox::dropout_bits(p.seed, p.stream, step, static_cast<std::uint64_t>(b));
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const std::int64_t i = 4 * b + k;
      if (i < n) y[i] = from_float<T>(philox::keep_bit(r.v[k], p.threshold) ? to_float(x[i]) * p.scale : 0.f);
    }
  }
}

}  // namespace

template <typename T>
void launch_dropout(const T* x, const std::int32_t* step, std::int64_t n, const DropoutParams& params, T* y,
                    cudaStream_t stream) {
  dropout_kernel<<<blocks_for((n + 3) / 4), kThreads, 0, stream>>>(x, step, n, params, y);
  SG_LAUNCH_CHECK("dropout_kernel");
}

template void launch_dropout<float>(const float*, const std::int32_t*, std::int64_t, const DropoutParams&, float*,
                                    cudaStream_t);
template void launch_dropout<__half>(const __half*, const std::int32_t*, std::int64_t, const DropoutParams&, __half*,
                                     cudaStream_t);
template void launch_dropout<__nv_bfloat16>(const __nv_bfloat16*, const std::int32_t*, std::int64_t,
                                            const DropoutParams&, __nv_bfloat16*, cudaStream_t);

}  // namespace sg::cuda
