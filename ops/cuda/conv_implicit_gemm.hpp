#pragma once
// Our own convolution kernels for the tiny shapes of small CNNs (issue 22):
// each direction is a GEMM whose operands are gathered from the NCHW tensors
// as the tiles are loaded (implicit GEMM, no im2col buffer), f32 accumulation
// (SIMT FMAs, not tensor cores), T = __half / __nv_bfloat16 / float in and out.
//   forward:         Y [N,O,OH,OW] = X (*) W [+ bias] [relu]:  M = N*OH*OW, N = O,        K = C*KH*KW
//   backward data:   dX [N,C,H,W] from dY and W:              M = N*H*W,   N = C,        K = O*KH*KW
//   backward filter: dW [O,C,KH,KW] from dY and X:            M = O,       N = C*KH*KW,  K = N*OH*OW
// The sum over K may be split over `splits` blocks (few output tiles, long
// K: the weight gradient); their f32 partials go to a workspace and a second
// kernel adds them in split order, so every run gives the same bits.
//
// That tiled GEMM is the generic path. Small images take a direct path
// instead (a CNN's images are tiny, and the GEMM's index gathering dominated
// there): one block per image (x a group of output channels) stages the
// image's (zero-padded) input planes and its filters in shared memory as f32
// and computes each output pixel for `group` output channels in registers.
// Backward data at stride 1 is the same kernel over dY with the transposed,
// flipped filter. Backward filter: block (items, image group, row slice)
// adds its images' products into an f32 partial of dW in registers (its
// threads' row slices added in a fixed order through shared memory), and a
// second kernel adds the blocks' partials in a fixed order: deterministic.
// In f16 / bf16 the direct weight gradient runs on tensor cores where its
// (channel, tap) tiles fit (conv_direct_wgrad_mma.cu; same partials).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace sg::cuda {

// X [n,c,h,w], W [o,c,kh,kw], Y [n,o,oh,ow]; zero padding on H and W alike.
// dy_channels_last (the weight gradient only): dY is [n,oh,ow,o], a
// channels-last network's first layer, whose one-channel X is the same
// bytes in either layout (graph/channels_last_pass.hpp).
struct ConvShape {
  std::int64_t n = 1, c = 1, h = 1, w = 1;
  std::int64_t o = 1, kh = 1, kw = 1;
  std::int64_t stride = 1, padding = 0;
  bool dy_channels_last = false;
  std::int64_t oh() const { return (h + 2 * padding - kh) / stride + 1; }
  std::int64_t ow() const { return (w + 2 * padding - kw) / stride + 1; }
};

enum class ConvPass : std::uint8_t { forward, backward_data, backward_filter };

// How one pass is launched: its tile of C (64 x 64, 256 x 16 or 16 x 256),
// its K split and the f32 workspace that needs.
struct ImplicitGemmPlan {
  ConvPass pass = ConvPass::forward;
  ConvShape shape;
  int tile_m = 64, tile_n = 64;
  int splits = 1;
  // The direct path (all fields below) when `direct`.
  bool direct = false;
  int group = 4;             // output channels per thread (forward, dgrad) / per item (wgrad): 2, 4 or 8
  int threads = 256;         // per block
  int shared_bytes = 0;      // dynamic shared memory per block
  int pixel_threads = 256;   // forward, dgrad: threads per channel group (each takes every pixel_threads-th pixel)
  int groups_per_block = 1;  // forward, dgrad: channel groups per block
  int ci_chunk = 1;          // forward, dgrad: input channels staged at a time (all of them when they fit)
  int per_chunk = 256;       // wgrad: (channel group, c, i, j) items per block
  int staged_channels = 1;   // wgrad: dY channels a block stages (its items' channel groups)
  int item_chunks = 1;       // wgrad: blocks over the items
  int slices = 1;            // wgrad: threads per item, each taking every slices-th output row
  int image_group = 1;       // wgrad: images per block
  int row_splits = 1;        // wgrad: blocks over the output rows of one image group
  // wgrad: the bias gradient too (db[o] = the sum of dY over n, oh, ow) in
  // the same pass: one more item per channel group whose input is 1. Asked
  // of plan_implicit_gemm; a plan keeps it only on the direct path.
  bool bias_gradient = false;
  // wgrad in f16 / bf16: the direct plan's tensor-core kernel, where the
  // shape fits it (conv_direct_wgrad_mma.cu): block (image group, range of
  // `range_pixels` output pixels, `groups_per_block` tile groups of dW),
  // staging `images_at_once` images a round; f32 runs the SIMT kernel above.
  struct TensorCoreWgrad {
    bool usable = false;
    int range_pixels = 16, ranges = 1, image_group = 1, images_at_once = 1;
    int tiles_m = 2, tiles_n = 4;  // a warp's mma tiles: 16 channels x 8 (tap) columns each
    int groups_per_block = 1, column_blocks = 1, shared_bytes = 0;
  } mma;
  std::size_t workspace_bytes() const;
};
// `direct_path` false forces the tiled GEMM (the tests run both paths).
ImplicitGemmPlan plan_implicit_gemm(ConvPass pass, const ConvShape& shape, int multiprocessors,
                                    bool direct_path = true, bool bias_gradient = false);
// How a plan runs, for the schedule's description.
std::string describe_plan(const ImplicitGemmPlan& plan);

// forward: y = x (*) w (+ bias when non-null), relu'd when `relu`.
template <typename T>
void launch_conv_forward(const ImplicitGemmPlan& plan, const T* x, const T* w, const T* bias, bool relu, T* y,
                         float* workspace, cudaStream_t stream);
template <typename T>
void launch_conv_backward_data(const ImplicitGemmPlan& plan, const T* dy, const T* w, T* dx, float* workspace,
                               cudaStream_t stream);
// Where a plan with bias_gradient writes db [o]: in T, or widened to f32
// (the T-rounded sum, as a cast of the graph's T value would give).
struct ConvBiasGradient {
  void* sums = nullptr;
  bool widened = false;
};
template <typename T>
void launch_conv_backward_filter(const ImplicitGemmPlan& plan, const T* dy, const T* x, T* dw, float* workspace,
                                 cudaStream_t stream, ConvBiasGradient bias = {});

}  // namespace sg::cuda
