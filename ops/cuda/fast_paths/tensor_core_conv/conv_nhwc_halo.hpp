#pragma once
// The halo form of the channels-last tensor-core convolution
// (conv_nhwc_halo.cu says how it works); conv_nhwc_mma.cu plans and calls it.
#include <cuda_runtime.h>

#include <cstddef>

#include "ops/cuda/fast_paths/tensor_core_conv/conv_nhwc_mma.hpp"

namespace sg::cuda::nhwc_conv {

// Shared memory a halo block may take (its halo and its filter rows).
constexpr std::size_t kHaloMaxShared = 160 * 1024;

// Output rows per block for `g` (the forward-shaped problem) with `bn`
// output channels a block and `pieces_per_warp` 16-row pieces a warp (2 or
// 4: blocks of at most 128 or 256 pixels); 0 where the halo form does not
// fit (an output row wider than that, or past kHaloMaxShared).
int halo_tile_rows(const NhwcConvShape& g, int bn, int pieces_per_warp);

// T = __half / __nv_bfloat16; (bn, pieces_per_warp) = (32, 4), (32, 2) or
// (64, 2); b_rows the rewritten filter.
template <typename T>
void launch_halo_conv(const NhwcConvShape& g, int bn, int pieces_per_warp, int tile_rows, const T* x,
                      const T* b_rows, const T* bias, bool relu, T* y, cudaStream_t stream);

}  // namespace sg::cuda::nhwc_conv
