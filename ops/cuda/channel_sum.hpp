#pragma once
// A convolution's bias gradient on the GPU: sums[c] = the sum over n and the
// plane of channel c of x [n, channels, plane] (NCHW; ref::channel_sum), f32
// accumulation in a fixed order (the same bits every run), and the same sum
// fused with the bias's SGD update (as launch_bias_grad_sgd does for
// reduce_rows): no gradient buffer.
//
// A channel's n*plane elements are cut into slices of at most about
// kChannelSliceElements, one block each, so a few channels still fill the
// GPU: whole planes of consecutive images (a 64 x 24 x 24 channel: 7 planes
// of 576 a slice, 10 blocks), or, for a plane larger than a slice, equal
// segments of one plane (multiples of 8 elements). A block reads whole
// planes (or segments) in vector packs, no index division per element. Each
// block writes its slice's partial and the last of a channel's blocks to
// finish adds the partials in a fixed order (whatever order the blocks ran
// in) and finishes the channel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/cuda_resources.hpp"
#include "ops/cuda/kernels.hpp"

namespace sg::cuda {

constexpr std::int64_t kChannelSliceElements = 4096;

// The launch geometry and scratch (partials, per-channel finished counters)
// of channel sums over one x shape; one object per launch site.
class ChannelSum {
 public:
  ChannelSum(std::int64_t n, std::int64_t channels, std::int64_t plane);

  // sums[c] = channel_sum(x)[c] rounded to G, stored as S: S = G, or float
  // when a cast to f32 follows (folded in: the cast of the rounded sum is exact).
  template <typename G, typename S>
  void sum(const G* x, S* sums, cudaStream_t stream) const;

  // bias[c] (and velocity[c]) updated by PyTorch's SGD step
  // (ops/cuda/sgd_step.cuh) with gradient channel_sum(x)[c] rounded to G, as
  // the graph stores it (a cast G -> f32 before an fp32 master bias's update
  // is then exact and folded in).
  template <typename W, typename G>
  void sum_sgd(const G* x, W* bias, W* velocity, const UpdateScalars* scalars, cudaStream_t stream) const;

  int slices() const { return slices_; }

 private:
  std::int64_t n_, channels_, plane_;
  int slices_ = 1;
  int images_per_slice_ = 1;  // whole planes a slice (1 when planes are cut into segments)
  int segments_ = 1;          // slices a plane (1: whole planes)
  int segment_ = 0;           // elements a segment (the plane when whole)
  DeviceBuffer partials_;  // [channels, slices]
  DeviceBuffer finished_;  // [channels] slices done this launch (reset by the last)
};

}  // namespace sg::cuda
