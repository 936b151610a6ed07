// Augmentation kernel (see augment.hpp): one thread per output element,
// grid-stride; each thread draws its example's choices (one Philox call,
// cheaper than a pass to share them) and gathers its source pixel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "ops/augment_draws.hpp"
#include "ops/cuda/augment.hpp"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/launch_config.cuh"

namespace sg::cuda {
namespace {

template <typename T>
__global__ void augment_images_kernel(const T* x, const std::int32_t* step_counter, AugmentGeometry g, T* y) {
  const std::int32_t step = *step_counter;
  const std::int64_t plane = g.h * g.w, total = g.n * g.channels * plane;
  const T fill = from_float<T>(g.fill);
  for (std::int64_t e = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t example = e / (g.channels * plane), i = (e % plane) / g.w, j = e % g.w;
    const augment::Draw d = augment::draw(g.seed, step, g.example_offset + example, g.translate, g.flip);
    const std::int64_t r = augment::source_row(d, i, g.h), c = augment::source_col(d, j, g.w);
    y[e] = r < 0 || c < 0 ? fill : x[e - i * g.w - j + r * g.w + c];
  }
}

}  // namespace

template <typename T>
void launch_augment_images(const T* x, const std::int32_t* step, const AugmentGeometry& g, T* y, cudaStream_t stream) {
  augment_images_kernel<<<blocks_for(g.n * g.channels * g.h * g.w), kThreads, 0, stream>>>(x, step, g, y);
  SG_LAUNCH_CHECK("augment_images_kernel");
}

template void launch_augment_images<float>(const float*, const std::int32_t*, const AugmentGeometry&, float*,
                                           cudaStream_t);
template void launch_augment_images<__half>(const __half*, const std::int32_t*, const AugmentGeometry&, __half*,
                                            cudaStream_t);
template void launch_augment_images<__nv_bfloat16>(const __nv_bfloat16*, const std::int32_t*, const AugmentGeometry&,
                                                   __nv_bfloat16*, cudaStream_t);

}  // namespace sg::cuda
