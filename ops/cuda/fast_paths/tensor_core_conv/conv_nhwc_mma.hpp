#pragma once
// Channels-last convolutions on tensor cores (issues 36, 37): the forward
// pass [+ bias] [+ relu] and, at stride 1, the backward data pass of a
// convolution whose activations are [N,H,W,C] in f16 or bf16, as an implicit
// GEMM on mma.sync m16n8k16 with f32 accumulation:
//   forward:       Y [N*OH*OW, O] = im2col(X) [N*OH*OW, KH*KW*C] x F [KH*KW*C, O]
//   backward data: the forward over dY [N,OH,OW,O] with the filter flipped in
//                  space and its channel axes swapped, padding KH-1-P, giving dX.
// A row of the GEMM is one output pixel; its K axis runs tap by tap, each tap
// a run of contiguous channels, so an A tile is loaded with 16-byte cp.async
// copies straight from the activation (zero-filled where the tap lies in the
// padding: no im2col buffer). The filter is first rewritten (one small
// launch) as [O][KH*KW][C] in the program's workspace, so B tiles are 16-byte
// copies as well (a forward given that layout, the [O,KH,KW,C] copy of
// graph/filter_layout_pass.hpp, reads it as it is). Every output element is one thread's sum in a fixed order:
// the same bits on every run. Where a shape is not taken (channels not a
// multiple of 16 / 8, f32), the caller keeps cuDNN or our NCHW kernels.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace sg::cuda {

// A convolution in the forward's terms: X [n,h,w,c], filter [o,c,kh,kw]
// (the parameter's layout), Y [n,oh,ow,o].
struct NhwcConvShape {
  std::int64_t n = 1, h = 1, w = 1, c = 1, o = 1, kh = 1, kw = 1, stride = 1, padding = 0;
  std::int64_t oh() const { return (h + 2 * padding - kh) / stride + 1; }
  std::int64_t ow() const { return (w + 2 * padding - kw) / stride + 1; }
};

enum class NhwcConvPass : std::uint8_t { forward, backward_data };

// The block tiles the kernel is built for (rows = output pixels x columns =
// output channels); nhwc_conv_tile_count() of them, indexed from 0. The last
// five are the halo form (conv_nhwc_halo.cu: whole output rows of one image, the
// input window copied once per block; three tiles) and the resident-filter
// form (conv_nhwc_resident.cu: the filter kept in shared memory while a block
// walks units of output rows; 32 and 64 channels a block); a shape they do
// not fit falls back to a GEMM tile.
int nhwc_conv_tile_count();

// How one pass runs: the forward-shaped problem the kernel computes (for the
// backward data pass: over dY, producing dX), its tile and K step.
struct NhwcConvPlan {
  NhwcConvPass pass = NhwcConvPass::forward;
  NhwcConvShape gemm;
  int tile = 0;
  int k_step = 32;     // channels per K step: 32 where the input channels allow, else 16
  int halo_rows = 0;   // the halo and resident forms' output rows per block or unit (their tiles only)
  int resident_blocks = 0;  // the resident form's blocks along the units
  bool filter_krsc = false;  // the filter given is [o,kh,kw,c] (else the parameter's [o,c,kh,kw])
  std::size_t filter_elements() const { return static_cast<std::size_t>(gemm.o * gemm.kh * gemm.kw * gemm.c); }
  std::string describe() const;  // "tensor-core NHWC conv, tile 128x64, K step 32"
};

// Why this kernel does not take the pass of `forward` ("" when it does).
std::string nhwc_conv_why_not(NhwcConvPass pass, const NhwcConvShape& forward);

// The plan of a pass the kernel takes, with tile `tile` (-1: chosen from the
// shape and `sm_count`, without timing).
NhwcConvPlan plan_nhwc_conv(NhwcConvPass pass, const NhwcConvShape& forward, int tile, int sm_count);

// T = __half or __nv_bfloat16. `filter` is the parameter [o,c,kh,kw], or
// [o,kh,kw,c] with plan.filter_krsc; `rewritten` holds
// plan.filter_elements() T (workspace, rewritten on every launch; a forward
// reads a [o,kh,kw,c] filter as it is, with no rewrite). Y / dX are written
// whole.
template <typename T>
void launch_nhwc_conv(const NhwcConvPlan& plan, const T* input, const T* filter, const T* bias, bool relu, T* output,
                      T* rewritten, cudaStream_t stream);

}  // namespace sg::cuda
