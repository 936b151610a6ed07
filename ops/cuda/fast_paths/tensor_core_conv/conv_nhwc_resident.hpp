#pragma once
// The resident-filter form of the channels-last tensor-core convolution
// (conv_nhwc_resident.cu says how it works); conv_nhwc_mma.cu plans and calls it.
#include <cuda_runtime.h>

#include <cstddef>

#include "ops/cuda/fast_paths/tensor_core_conv/conv_nhwc_mma.hpp"

namespace sg::cuda::nhwc_conv {

// Shared memory a resident block may take: its filter rows and two halos.
constexpr std::size_t kResidentMaxShared = 227 * 1024;

// How the resident form splits `g` (the forward-shaped problem) with `bn`
// output channels a block: output rows a unit (one image's rows, at most 256
// pixels) and blocks along the units; tile_rows 0 where it does not fit.
struct ResidentSplit {
  int tile_rows = 0;
  int blocks = 0;
};
ResidentSplit resident_split(const NhwcConvShape& g, int bn, int sm_count);

// Whether this process's GPU runs the resident form: it is built for sm_90a alone (the filter's
// multicast copies), so elsewhere the planner keeps the other tiles. Read once per process.
bool resident_conv_runs_here();

// T = __half / __nv_bfloat16; bn = 32 or 64; b_rows the rewritten filter.
template <typename T>
void launch_resident_conv(const NhwcConvShape& g, int bn, const ResidentSplit& split, const T* x, const T* b_rows,
                          const T* bias, bool relu, T* y, cudaStream_t stream);

}  // namespace sg::cuda::nhwc_conv
