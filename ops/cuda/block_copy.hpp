#pragma once
// Copies of a block of columns between row-major matrices on the GPU (issue
// 37's concat and its gradient, slice_channels): for each of `rows` rows,
// `width` consecutive elements from src[row * src_stride + src_offset] to
// dst[row * dst_stride + dst_offset]. A [N, C, ...] value is N rows of C
// channels, so a block of channels is a block of columns.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace sg::cuda {

struct BlockCopy {
  std::int64_t rows = 0, width = 0;
  std::int64_t src_stride = 0, src_offset = 0;
  std::int64_t dst_stride = 0, dst_offset = 0;
};

template <typename T>
void launch_block_copy(const T* src, T* dst, const BlockCopy& copy, cudaStream_t stream);

}  // namespace sg::cuda
