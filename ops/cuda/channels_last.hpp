#pragma once
// Kernels for channels-last (NHWC) activations, [n, h, w, c] with c fastest:
// small CNNs read a pixel's channels as one contiguous run, so a warp's
// threads take consecutive channels (coalesced, 16-byte packs where c and the
// pointers allow) instead of one plane each.
//   - max pooling and its fused relus (channels_last_pool.cu): the contract of
//     the NCHW kernels (pooling.hpp; ref::max_pool2d and friends) applied per
//     (n, c) plane, bit for bit;
//   - channel sums over the rows of [n*h*w, c] (channels_last_sum.cu): a conv
//     bias gradient, ChannelSum's contract (channel_sum.hpp) for this layout;
//   - the NCHW <-> NHWC copy (channels_last_permute.cu).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/activation.hpp"
#include "ops/cuda/cuda_resources.hpp"
#include "ops/cuda/kernels.hpp"

#if defined(__CUDACC__)
#define SG_CHANNELS_LAST_HD __host__ __device__
#else
#define SG_CHANNELS_LAST_HD
#endif

namespace sg::cuda {

// ---- max pooling: x [n, h, w, c] -> [n, oh, ow, c], square k x k windows at
// stride s, no padding, floored output (PoolGeometry's sizes).
// pooled_channels_first: the pooled-sized tensors (forward: pooled and
// activated; backward: dy, relu_before and relu_before_grad) are [n, c, oh,
// ow] instead: the conversion back to NCHW at the end of a channels-last
// region (to_channels_first before a flatten, and its gradient) done by the
// pooling's own launch.
struct ChannelsLastPool {
  std::int64_t n = 1, h = 1, w = 1, c = 1;
  std::int64_t kernel = 2, stride = 2;
  bool pooled_channels_first = false;
  SG_CHANNELS_LAST_HD std::int64_t oh() const { return (h - kernel) / stride + 1; }
  SG_CHANNELS_LAST_HD std::int64_t ow() const { return (w - kernel) / stride + 1; }
};

// pooled (optional): max_pool2d(x); activated (optional): relu(pooled). At
// least one is non-null. A window's value is its first maximum, a NaN winning
// over numbers (ref::max_pool2d); relu(NaN) = 0 (ref::relu).
template <typename T>
void launch_max_pool2d_nhwc_forward(const T* x, const ChannelsLastPool& g, T* pooled, T* activated,
                                    cudaStream_t stream);

// The activation before the pooling in the same pass: z is its input,
// activated_input (optional: where the backward reads it) receives act(z)
// rounded to T (activation.cuh's math, as the element-wise kernel), pooled
// and activated as above over those values. The windows must tile the
// input (activation_pool_tiles), so each element is written once.
SG_CHANNELS_LAST_HD inline bool activation_pool_tiles(const ChannelsLastPool& g) {
  return g.kernel == g.stride && g.h % g.kernel == 0 && g.w % g.kernel == 0;
}
template <typename T>
void launch_activation_max_pool2d_nhwc_forward(const T* z, Activation act, const ChannelsLastPool& g,
                                               T* activated_input, T* pooled, T* activated, cudaStream_t stream);

// The backward chain dy [n, oh, ow, c] -> dx [n, h, w, c], PoolBackwardTensors'
// roles (pooling.hpp) without the dropout:
//   [relu_backward(., relu_before)] -> max_pool2d_backward(., x) -> [relu_backward(., relu_after)]
// (or the backward of another activation after_activation in place of the last)
// Each step rounded to T as the graph stores it; intermediates written only
// through non-null pointers. dx is the chain's result: pool_grad, or
// relu_after_grad when there is a relu_after.
template <typename T>
struct ChannelsLastPoolBackward {
  const T* dy = nullptr;
  const T* relu_before = nullptr;  // the output of the relu after the pooling (optional), [n, oh, ow, c]
  const T* x = nullptr;            // the pooling's input: the argmax
  const T* relu_after = nullptr;   // the output of the relu before the pooling (optional), [n, h, w, c]
  T* relu_before_grad = nullptr;   // [n, oh, ow, c], optional
  T* pool_grad = nullptr;          // [n, h, w, c], optional unless it is the result
  T* relu_after_grad = nullptr;    // [n, h, w, c], optional unless it is the result
  T* dx = nullptr;                 // the chain's result: one of the two above
  // The activation before the pooling, when not a ReLU: relu_after then
  // holds what its backward reads (activation.hpp: the forward's input for
  // gelu, gelu_tanh and silu, its output for tanh and sigmoid) and
  // relu_after_grad receives act_backward(pool_grad, relu_after).
  Activation after_activation = Activation::relu;
};

// Each incoming gradient goes to the FIRST maximum of its window in row-major
// order (ref::max_pool2d_argmax); overlapping windows add in (oy, ox) order,
// in f32; elements in no window get 0.
template <typename T>
void launch_max_pool2d_nhwc_backward(const ChannelsLastPoolBackward<T>& t, const ChannelsLastPool& g,
                                     cudaStream_t stream);

// ---- channel sums: sums[ch] = the sum over the rows of x [rows, channels]
// (rows = n*h*w), f32 accumulation in a fixed order (the same bits every run
// for a given shape and x alignment). Rows are cut into slices, one block
// each per group of channels, so a few hundred blocks fill the GPU; each
// block writes f32 partials and the last of a group's blocks to finish adds
// them in slice order and finishes. The scratch (partials, finished
// counters) belongs to the object: one object per launch site, and not two
// of its launches at once.
class ChannelsLastSum {
 public:
  ChannelsLastSum(std::int64_t rows, std::int64_t channels);

  // sums[ch] = the sum rounded to G, stored as S: S = G, or float when a cast
  // to f32 follows (folded in: the cast of the rounded sum is exact).
  template <typename G, typename S>
  void sum(const G* x, S* sums, cudaStream_t stream) const;

  // bias[ch] (and velocity[ch], when non-null) updated by PyTorch's SGD step
  // (sgd_step.cuh) with the gradient the sum rounded to G, as ChannelSum::sum_sgd.
  template <typename W, typename G>
  void sum_sgd(const G* x, W* bias, W* velocity, const UpdateScalars* scalars, cudaStream_t stream) const;

  int slices() const { return slices_; }

 private:
  template <typename W, typename G, typename S>
  void launch(const G* x, S* sums, W* bias, W* velocity, const UpdateScalars* scalars, cudaStream_t stream) const;

  std::int64_t rows_, channels_;
  int slices_ = 1;
  std::int64_t rows_per_slice_ = 1;
  DeviceBuffer partials_;  // [slices, channels] f32, when slices > 1
  DeviceBuffer finished_;  // [channel groups] blocks done this launch (reset by the last); sized for the narrowest pack
};

// ---- layout: y = x with each image's [c, hw] matrix transposed.
// to_channels_last: x [n, c, hw] -> y [n, hw, c]; else x [n, hw, c] -> y [n, c, hw].
// An exact copy of the bits; y must not overlap x.
template <typename T>
void launch_channels_permute(const T* x, std::int64_t n, std::int64_t c, std::int64_t hw, bool to_channels_last, T* y,
                             cudaStream_t stream);

}  // namespace sg::cuda
