// Dropout2d: one block-stride sweep over the elements; each thread draws the
// keep bit of its element's plane (one Philox call per element: cheaper than
// a second pass or shared-memory handoff at these sizes, and stateless, so
// any grid gives the same bits).
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/dropout2d.hpp"
#include "ops/cuda/launch_config.cuh"
#include "ops/philox.hpp"

namespace sg::cuda {
namespace {

template <typename T>
__global__ void dropout2d_kernel(const T* x, const std::int32_t* step_counter, std::int64_t planes, std::int64_t plane,
                                 DropoutParams p, T* y) {
  const std::int32_t step = *step_counter;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < planes * plane;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const bool keep = philox::dropout_keep(p.seed, p.stream, step, i / plane, p.threshold);
    y[i] = from_float<T>(keep ? to_float(x[i]) * p.scale : 0.f);
  }
}

}  // namespace

template <typename T>
void launch_dropout2d(const T* x, const std::int32_t* step, std::int64_t planes, std::int64_t plane,
                      const DropoutParams& params, T* y, cudaStream_t stream) {
  dropout2d_kernel<<<blocks_for(planes * plane), kThreads, 0, stream>>>(x, step, planes, plane, params, y);
  SG_LAUNCH_CHECK("dropout2d_kernel");
}

template void launch_dropout2d<float>(const float*, const std::int32_t*, std::int64_t, std::int64_t,
                                      const DropoutParams&, float*, cudaStream_t);
template void launch_dropout2d<__half>(const __half*, const std::int32_t*, std::int64_t, std::int64_t,
                                       const DropoutParams&, __half*, cudaStream_t);
template void launch_dropout2d<__nv_bfloat16>(const __nv_bfloat16*, const std::int32_t*, std::int64_t, std::int64_t,
                                              const DropoutParams&, __nv_bfloat16*, cudaStream_t);

}  // namespace sg::cuda
