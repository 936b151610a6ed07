#pragma once
// What the whole-step kernel (whole_step.cu) and the resident-step kernel
// (resident_step.cu) share: the hidden activation's forward epilogue and
// backward as both round them, and the launch configuration of one
// thread-block cluster.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "ops/cuda/activation.cuh"

namespace sg::cuda {

// A hidden layer's forward epilogue of the fp32 sum s: for ReLU act(s + b)
// rounded once (the epilogue these kernels always had); for the others
// act(z) of z = fp16(s + b), as the small-batch forward and the graph's
// bias_add and activation nodes compute it, with z stored at pre[at] where
// the activation's backward reads it.
template <Activation A, typename Index>
__device__ __forceinline__ __half forward_epilogue(float s, __half bias, __half* pre, Index at) {
  if constexpr (A == Activation::relu) {
    return __float2half(fmaxf(s + __half2float(bias), 0.f));
  } else {
    const __half z = __float2half(s + __half2float(bias));
    if constexpr (kBackwardReadsInput<A>) pre[at] = z;
    return __float2half(ActivationMath<A>::forward(__half2float(z)));
  }
}

// The activation's backward of the fp32 sum s given the saved fp16 value v
// (the output for relu, tanh, sigmoid; the pre-activation for the others),
// rounded once to fp16 as our one-pass and small-K dgrad kernels round it.
template <Activation A>
__device__ __forceinline__ __half activation_backward(float s, __half v) {
  if constexpr (A == Activation::relu)  // (the select these kernels always made: the ReLU instances are unchanged)
    return __half2float(v) > 0.f ? __float2half(s) : __float2half(0.f);
  else
    return __float2half(ActivationMath<A>::backward(s, __half2float(v)));
}

// A launch of ONE cluster of `blocks` blocks (for cudaLaunchKernelEx and
// cudaOccupancyMaxActiveClusters); `attr` holds its cluster attribute.
inline cudaLaunchConfig_t one_cluster_config(int blocks, int threads, std::size_t smem, cudaStream_t stream,
                                             cudaLaunchAttribute& attr) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(blocks));
  cfg.blockDim = dim3(unsigned(threads));
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = unsigned(blocks);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return cfg;
}

}  // namespace sg::cuda
