#pragma once
// Convolutions whose input has few channels (an image network's first
// layer: 1 channel for MNIST, 3 for RGB), channels-last, f16 / bf16 on
// tensor cores with f32 accumulation. Such a layer's GEMM has K = c*kh*kw
// of 9-147: cuDNN's channels-last engines and our direct kernels spent
// 13-34 us on MNIST's 1 -> 32 layers at batch 128 (docs/benchmarks.md), and
// a CUDA-core version of these kernels issued 25 FMA instructions a pixel.
//   forward:  Y [n,oh,ow,o] = X [n,h,w,c] (*) W [o,c,kh,kw] (+ bias) (relu):
//     M = output pixels, N = o, K = c*kh*kw padded to 16; block (band of
//     output rows, image) stages the filter and the band's input, and each
//     thread gathers its A elements from the staged input at its pixels'
//     first tap plus a table of tap offsets (few_channel_forward.cu).
//   weight gradient: dW [o,c,kh,kw] (and db [o]) from dY [n,oh,ow,o] and X:
//     M = o, N = the taps (and a column of ones: the bias), K = pixels;
//     block (band, image, tap chunk) adds its pixels into one f32 partial
//     (the warps' in a fixed tree), and a second kernel adds the partials in
//     block order (wgrad_partials.cuh): the same bits every run
//     (few_channel_wgrad.cu).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "ops/cuda/activation.hpp"
#include "ops/cuda/cuda_resources.hpp"

namespace sg::cuda {

struct FewChannelConvShape {
  std::int64_t n = 1, h = 1, w = 1, c = 1;  // input [n, h, w, c]
  std::int64_t o = 8, kh = 1, kw = 1;       // filter [o, c, kh, kw]
  std::int64_t stride = 1, padding = 0;
  std::int64_t oh() const { return (h + 2 * padding - kh) / stride + 1; }
  std::int64_t ow() const { return (w + 2 * padding - kw) / stride + 1; }
};

// "" when these kernels take the shape, else why not (input channels over
// kFewChannelMax, output channels over 128, a kernel wider than 7, stride
// over 2, padding >= the kernel, too large for 32-bit indexing or for shared
// memory). Any count of output channels: the mma tiles' spare rows are zero
// filters (forward) or zero dY (weight gradient), their results not stored.
inline constexpr std::int64_t kFewChannelMax = 4;
std::string few_channel_conv_why_not(const FewChannelConvShape& shape);
// The weight gradient's shared memory for bands of `rows` output rows (`gated`: with an activation gate).
std::int64_t few_channel_wgrad_shared_bytes(const FewChannelConvShape& shape, int rows, bool gated = false);
// Whether the weight gradient of a shape these kernels take (few_channel_conv_why_not "") can also stage an
// activation's saved value beside dY (FewChannelWgrad's gate): one output row of both within the shared-memory budget.
bool few_channel_wgrad_gate_fits(const FewChannelConvShape& shape);

// The forward's launch: bands of `band_rows` output rows per block.
struct FewChannelForwardPlan {
  FewChannelConvShape shape;
  int band_rows = 1, bands = 1, shared_bytes = 0;
  std::string describe() const;
};
// band_rows 0: chosen from the shape (the tests force others).
FewChannelForwardPlan plan_few_channel_forward(const FewChannelConvShape& shape, int multiprocessors,
                                               int band_rows = 0);
// The forward [+ bias] [+ relu]; T = __half or __nv_bfloat16; y 16-byte aligned.
template <typename T>
void launch_few_channel_forward(const FewChannelForwardPlan& plan, const T* x, const T* w, const T* bias, bool relu,
                                T* y, cudaStream_t stream);

// The step's batch fetch (batch_fetch.cu) taken into the forward: block
// (band, image i) reads image perm[(step % batches) * global + rank * n + i]
// of the u8 table (batches = rows / global, global = n * ranks), each pixel
// scaled as batch_fetch writes it (scaled_pixel.cuh), stages
// its band from there, writes its own rows of X to x_out (when non-null: a
// later launch reads X) and, in band 0, the image's label. The table's rows
// must be X's images in X's layout (one channel: a row of the NCHW batch is
// channels-last already).
struct FewChannelFetch {
  const std::int32_t* perm = nullptr;
  std::int64_t rows = 0;  // images in the table (perm's length)
  const std::int32_t* step = nullptr;
  std::int64_t rank = 0, ranks = 1;
  const std::uint8_t* images = nullptr;  // [rows, h * w * c]
  float scale = 1.f, shift = 0.f;
  const std::uint8_t* labels = nullptr;  // [rows]
  void* x_out = nullptr;                 // T [n, h, w, c], or null
  std::int32_t* labels_out = nullptr;    // [n]
};

// Everything a forward launch reads and writes, for the general entry below.
struct FewChannelForwardArgs {
  const void* x = nullptr;  // T [n, h, w, c]; unread (may be null) with a fetch
  FewChannelFetch fetch;    // fetch.images non-null: the batch fetch in the launch
  const void* w = nullptr;  // [o, c, kh, kw]: T, or f32 with params_f32
  const void* bias = nullptr;  // [o] like w, or null
  // w and bias are the fp32 master values, each rounded to T as it is
  // staged (from_float, as the parameters' cast kernel rounds): the cast in
  // the launch, whose f16/bf16 copy no launch then reads.
  bool params_f32 = false;
  bool relu = false;
  void* y = nullptr;  // T [n, oh, ow, o], 16-byte aligned
};
template <typename T>
void launch_few_channel_forward(const FewChannelForwardPlan& plan, const FewChannelForwardArgs& args,
                                cudaStream_t stream);

// The weight gradient [+ the bias gradient] of one launch site: it owns its
// partials (not two of its launches at once). db, when non-null, is the sum
// rounded to T and stored as B: T, or float where a cast to f32 follows.
// With `gate`, the gradient the convolution's output gets is
// act_backward(dY, saved) (activation.cuh) rounded to T: the activation
// after the convolution, whose backward then needs no launch of its own;
// `saved` is what that backward reads (the activation's output, or its
// input for gelu, gelu_tanh and silu), [n, oh, ow, o] like dY.
class FewChannelWgrad {
 public:
  // band_rows 0: chosen from the shape (the tests force others).
  FewChannelWgrad(const FewChannelConvShape& shape, bool bias_gradient, int multiprocessors, int band_rows = 0,
                  std::optional<Activation> gate = std::nullopt);

  template <typename T, typename B>
  void run(const T* dy, const T* x, T* dw, B* db, cudaStream_t stream, const T* saved = nullptr) const;

  std::string describe() const;

 private:
  FewChannelConvShape shape_;
  bool bias_gradient_;
  std::optional<Activation> gate_;
  int band_rows_ = 1, bands_ = 1, shared_bytes_ = 0;  // the tap chunks come from the shape (wgrad_geometry)
  DeviceBuffer partials_;  // [blocks][o * (c*kh*kw [+ 1])] f32
};

}  // namespace sg::cuda
