// Dropout2d: a block takes a run of one example's elements; its threads first
// draw the keep factors (scale or 0) of that example's channels into shared
// memory, one Philox call a channel, then sweep the run reading them. (One
// Philox call per element, as before, cost 13.8 us for 1.3M elements on an
// H200: the calls, not the bytes, bound it.) The bits are a pure function of
// (seed, stream, step, n*C + c), so any grid, either layout and the CPU
// reference drop the same channels.
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/dropout2d.hpp"
#include "ops/cuda/launch_config.cuh"
#include "ops/philox.hpp"

namespace sg::cuda {
namespace {

constexpr std::int64_t kRunElements = 4096;  // elements a block sweeps (16 a thread at kThreads = 256)

template <typename T>
__global__ void dropout2d_kernel(const T* x, const std::int32_t* step_counter, Dropout2dShape s, DropoutParams p,
                                 T* y) {
  extern __shared__ float factor[];  // [channels]: scale when kept, 0 when dropped (scale > 0: p < 1)
  const std::int32_t step = *step_counter;
  const std::int64_t per_example = s.channels * s.plane;
  const std::int64_t runs = (per_example + kRunElements - 1) / kRunElements;
  const std::int64_t example = blockIdx.x / runs, first = (blockIdx.x % runs) * kRunElements;
  for (std::int64_t c = threadIdx.x; c < s.channels; c += blockDim.x)
    factor[c] = philox::dropout_keep(p.seed, p.stream, step, example * s.channels + c, p.threshold) ? p.scale : 0.f;
  __syncthreads();
  const std::int64_t end = min(first + kRunElements, per_example);
  const T* in = x + example * per_example;
  T* out = y + example * per_example;
  for (std::int64_t e = first + threadIdx.x; e < end; e += blockDim.x) {
    const std::int64_t c = s.channels_last ? e % s.channels : e / s.plane;
    // A dropped element is +0 whatever x is (a NaN or -x too), as ref::dropout2d writes it.
    out[e] = from_float<T>(factor[c] != 0.f ? to_float(in[e]) * factor[c] : 0.f);
  }
}

}  // namespace

template <typename T>
void launch_dropout2d(const T* x, const std::int32_t* step, const Dropout2dShape& shape, const DropoutParams& params,
                      T* y, cudaStream_t stream) {
  const std::int64_t runs = (shape.channels * shape.plane + kRunElements - 1) / kRunElements;
  const std::size_t shared = static_cast<std::size_t>(shape.channels) * sizeof(float);
  if (shape.examples * runs == 0) return;
  if (shared > 48 * 1024) SG_CUDA_CHECK(cudaFuncSetAttribute(dropout2d_kernel<T>,
                                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                             static_cast<int>(shared)));
  dropout2d_kernel<<<static_cast<unsigned>(shape.examples * runs), kThreads, shared, stream>>>(x, step, shape, params,
                                                                                               y);
  SG_LAUNCH_CHECK("dropout2d_kernel");
}

#define SG_INSTANTIATE_DROPOUT2D(T)                                                                           \
  template void launch_dropout2d<T>(const T*, const std::int32_t*, const Dropout2dShape&, const DropoutParams&, \
                                    T*, cudaStream_t);
SG_INSTANTIATE_DROPOUT2D(float)
SG_INSTANTIATE_DROPOUT2D(__half)
SG_INSTANTIATE_DROPOUT2D(__nv_bfloat16)
#undef SG_INSTANTIATE_DROPOUT2D

}  // namespace sg::cuda
