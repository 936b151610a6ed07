// Column-block copies (see block_copy.hpp): one thread per copied element,
// grid-stride, 16-byte vectors where every address and width allows.
#include "ops/cuda/block_copy.hpp"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/launch_config.cuh"

namespace sg::cuda {
namespace {

// V: the unit copied (T, or a 16-byte vector of T); the copy's sizes in units of V.
template <typename V>
__global__ void block_copy_kernel(const V* src, V* dst, BlockCopy c) {
  const std::int64_t total = c.rows * c.width;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t row = i / c.width, col = i % c.width;
    dst[row * c.dst_stride + c.dst_offset + col] = src[row * c.src_stride + c.src_offset + col];
  }
}

}  // namespace

template <typename T>
void launch_block_copy(const T* src, T* dst, const BlockCopy& copy, cudaStream_t stream) {
  constexpr std::int64_t vec = kVec<T>;
  const bool vectorised = aligned16(src) && aligned16(dst) && copy.width % vec == 0 && copy.src_stride % vec == 0 &&
                          copy.src_offset % vec == 0 && copy.dst_stride % vec == 0 && copy.dst_offset % vec == 0;
  if (vectorised) {
    const BlockCopy v{copy.rows, copy.width / vec, copy.src_stride / vec, copy.src_offset / vec,
                      copy.dst_stride / vec, copy.dst_offset / vec};
    block_copy_kernel<<<blocks_for(v.rows * v.width), kThreads, 0, stream>>>(
        reinterpret_cast<const Vec16<T>*>(src), reinterpret_cast<Vec16<T>*>(dst), v);
  } else {
    block_copy_kernel<<<blocks_for(copy.rows * copy.width), kThreads, 0, stream>>>(src, dst, copy);
  }
  SG_LAUNCH_CHECK("block_copy_kernel");
}

template void launch_block_copy<float>(const float*, float*, const BlockCopy&, cudaStream_t);
template void launch_block_copy<__half>(const __half*, __half*, const BlockCopy&, cudaStream_t);
template void launch_block_copy<__nv_bfloat16>(const __nv_bfloat16*, __nv_bfloat16*, const BlockCopy&, cudaStream_t);

}  // namespace sg::cuda
