#pragma once
// What the CNN step's three translation units share (cnn_step.cu: kernel 1;
// cnn_step_update.cu: the update kernel and the image rebuild;
// cnn_step_layout.cu: the host-side layout): the block shape, the rounding
// of the graph's fp16 or bf16 values, the conv GEMMs' index encoding, the staged
// weights' strides, the workspace's addressing. In an unnamed namespace with
// every function inline: each translation unit keeps its own copy, as when
// they were one file.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "ops/cuda/conv_window.cuh"
#include "ops/cuda/fast_paths/cnn_step/cnn_step.hpp"

namespace sg::cuda {
namespace {

constexpr int kExampleThreads = 512;  // kernel 1: a block per example
constexpr int kUpdateThreads = 256;

// The compute dtype's element (CnnStepArgs::bf16): kernel 1 is compiled for
// each, since its tensor-core instructions name the type.
template <class T>
__device__ __forceinline__ T to_compute(float x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16_rn(x);
  else return __float2half_rn(x);
}
template <class T>
__device__ __forceinline__ float from_compute(T x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(x);
  else return __half2float(x);
}
// The value a tensor of the graph's compute dtype T holds.
template <class T>
__device__ __forceinline__ float rounded(float x) {
  return from_compute<T>(to_compute<T>(x));
}
// The same, the dtype chosen at run time (the update kernel's element-wise code).
__device__ __forceinline__ float rounded(float x, bool bf16) {
  return bf16 ? rounded<__nv_bfloat16>(x) : rounded<__half>(x);
}

__host__ __device__ constexpr int round_up(int x, int m) { return (x + m - 1) / m * m; }

// The threads of a block of kernel 1 and its dynamic shared memory, as every phase sees them.
struct Block {
  float* smem;
  int tid, threads, warp, lane, warps;
};

// A warp takes a 16-row tile of C times kColumnTiles 8-column tiles, so one
// gathered A fragment feeds that many mma. One width for every GEMM keeps
// one copy of each GEMM's code: each runs once per example, so its code is
// fetched again every step (with a width per layer, 17% of kernel 1's
// stalls in ncu waited on instruction fetch), which cost more than the mma
// a narrow layer saves.
constexpr int kColumnTiles = 3;

// A row or column of a gather: x = offset in the source, y = the window
// corner or tap displacement as (dy << 16 | dx & 0xffff); kNoIndex marks a
// row or column past the GEMM's end (it reads 0).
constexpr int kNoIndex = int(0x80000000u);
__host__ __device__ inline int2 patch_index(int offset, int dy, int dx) {
  return make_int2(offset, int((unsigned(dy) << 16) | (unsigned(dx) & 0xffffu)));
}
__host__ __device__ inline int2 no_patch_index() { return make_int2(0, kNoIndex); }
__device__ __forceinline__ int index_dy(int yx) { return yx >> 16; }
__device__ __forceinline__ int index_dx(int yx) { return static_cast<short>(yx & 0xffff); }

// Window `p` of a convolution (row-major over its output) and tap `k` (ci, ky, kx) of its kernel.
__host__ __device__ inline int2 window_index(const CnnLayer& L, int p) {
  const int y = window_origin(p / L.out_w, L.stride, L.padding), x = window_origin(p % L.out_w, L.stride, L.padding);
  return patch_index(y * L.in_w + x, y, x);
}
__host__ __device__ inline int2 tap_index(const CnnLayer& L, int k) {
  const int kk = L.kernel_h * L.kernel_w, ci = k / kk, ky = (k % kk) / L.kernel_w, kx = k % L.kernel_w;
  return patch_index(ci * L.in_h * L.in_w + ky * L.in_w + kx, ky, kx);
}

// Row strides of the staged fp16 weights (CnnStepLaunch::weight_offset):
// a conv layer's forward B is [co][tap], its data gradient's B [ci][(co, ky, kx)],
// each row padded to 16 k and 8 more halves, so the 8 rows a warp's B
// fragment reads fall in different banks.
__host__ __device__ inline int forward_stride(const CnnLayer& L) {
  return round_up(L.in_c * L.kernel_h * L.kernel_w, 16) + 8;
}
__host__ __device__ inline int data_stride(const CnnLayer& L) {
  return round_up(L.out_c * L.kernel_h * L.kernel_w, 16) + 8;
}
// Row stride of a conv layer's dY^T staged as fp16 rows [co][pos] (its weight gradient's B).
__host__ __device__ inline int dy_stride(const CnnLayer& L) { return round_up(L.out_h * L.out_w, 16) + 8; }
// The data gradient's dY copy: dilated by the stride, with a border of
// kernel - 1 - padding, (in_h + kernel_h - 1) x (in_w + kernel_w - 1) per channel.
__host__ __device__ inline int bordered_size(const CnnLayer& L) {
  return L.out_c * (L.in_h + L.kernel_h - 1) * (L.in_w + L.kernel_w - 1);
}
__host__ __device__ inline bool has_parameters(const CnnLayer& L) {
  return L.op == CnnLayerOp::conv2d || L.op == CnnLayerOp::linear;
}
// Whether layer li (pooling or linear) also applies the ReLU layer after it,
// which then runs no phase of its own (one barrier and pass fewer each way).
inline bool relu_fused_into(const CnnStepArgs& a, int li) {
  return li + 1 < a.layers && a.layer[li + 1].op == CnnLayerOp::relu &&
         (a.layer[li].op == CnnLayerOp::max_pool2d || a.layer[li].op == CnnLayerOp::linear);
}
inline bool fused_relu(const CnnStepArgs& a, int li) {
  return li > 0 && a.layer[li].op == CnnLayerOp::relu && relu_fused_into(a, li - 1);
}

// The workspace (cnn_step_workspace_bytes), for a kernel 1 grid of
// `blocks`: the blocks' gradient slices, then the examples' factor rows,
// then the examples' losses, then the step counter at the step's start.
__device__ __forceinline__ float* factor_rows(const CnnStepArgs& a, const CnnStepLaunch& l, int blocks) {
  return a.workspace + std::int64_t(blocks) * l.slice_floats;
}
__device__ __forceinline__ float* example_losses(const CnnStepArgs& a, const CnnStepLaunch& l, int blocks) {
  return factor_rows(a, l, blocks) + std::int64_t(a.batch) * l.factor_floats;
}
// The step counter as kernel 1 read it: the update rules' bias correction
// reads it here, since the update kernel's last block advances the counter
// while its other blocks may not have started.
__device__ __forceinline__ std::int32_t* step_at_start(const CnnStepArgs& a, const CnnStepLaunch& l, int blocks) {
  return reinterpret_cast<std::int32_t*>(example_losses(a, l, blocks) + a.batch);
}

// The arguments as copied into shared memory at the start: read by every
// warp in every layer with indices known only at run time, which are slow
// loads from the kernel parameters' constant bank.
struct SharedArguments {
  CnnStepArgs args;
  CnnStepLaunch launch;
};

}  // namespace
}  // namespace sg::cuda
