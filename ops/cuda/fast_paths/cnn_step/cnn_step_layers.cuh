#pragma once
// The CNN step's other layers and the copies into a block's shared memory
// (kernel 1, cnn_step.cu, which alone includes this): the parameter image's
// asynchronous copies, the example's fetch, max pooling (pool_window.cuh),
// the activations, dropout's keep bits, the linear layers. In an unnamed namespace, as in the
// kernel's own file.
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "ops/cuda/activation.cuh"
#include "ops/cuda/async_copy.cuh"
#include "ops/cuda/fast_paths/cnn_step/cnn_step_shapes.cuh"
#include "ops/cuda/pool_window.cuh"
#include "ops/cuda/warp_reduce.cuh"
#include "ops/philox.hpp"

namespace sg::cuda {
namespace {

// `bytes` (a multiple of 4) from `src` to `dst`, a word per thread.
__device__ __forceinline__ void copy_words(const Block& b, const void* src, void* dst, std::size_t bytes) {
  const auto* from = static_cast<const std::uint32_t*>(src);
  auto* to = static_cast<std::uint32_t*>(dst);
  for (std::size_t i = b.tid; i < bytes / 4; i += b.threads) to[i] = from[i];
}

// `count` floats from global to shared memory, asynchronously (cp.async):
// 16 bytes a copy where the source is aligned so (`dst` always is).
__device__ void copy_to_shared(const Block& b, const float* src, int count, float* dst) {
  const int vectors = reinterpret_cast<std::uintptr_t>(src) % 16 == 0 ? count / 4 : 0;
  for (int q = b.tid; q < vectors; q += b.threads) copy_async16(shared_address(dst + 4 * q), src + 4 * q);
  for (int i = 4 * vectors + b.tid; i < count; i += b.threads) copy_async4(shared_address(dst + i), src + i);
}

// Part `p` of the parameter image (CnnStepLaunch::part_start) into its place
// in shared memory, as one group of asynchronous copies: once per block,
// kernel 1 updates no parameter. Parts arrive in order; layer_ready waits
// for those up to a layer's.
__device__ void copy_image_part(const Block& b, const CnnStepArgs& a, const CnnStepLaunch& l, int p) {
  const int start = p == 0 ? 0 : l.part_start[p - 1], end = p == kImageParts - 1 ? l.image_floats : l.part_start[p];
  copy_to_shared(b, a.image + start, end - start, b.smem + l.image_offset + start);
  if (p == 0) copy_to_shared(b, a.index_tables, l.tables_floats, b.smem + l.tables_offset);  // the first GEMM's too
  commit_copies();
}
// Before layer li of the first example: where it opens part 1 or 2 of the
// image, that part's copies (and those before) have landed, for every thread.
__device__ void layer_ready(const CnnStepLaunch& l, int li) {
  if (li == l.part_layer[1]) {  // (part 1 may be empty and open here too)
    wait_copies<0>();
    __syncthreads();
  } else if (li == l.part_layer[0]) {
    wait_copies<1>();
    __syncthreads();
  }
}

// Window (oy, ox) of a pooling layer's input plane (square, kernel_h wide):
// its first maximum and where it is (pool_window.cuh, as the max_pool2d kernels).
__device__ __forceinline__ WindowMax<int> pool_window(const float* plane, const CnnLayer& L, int oy, int ox) {
  return window_max([&](int at) { return plane[at]; }, L.in_w, L.kernel_h, L.stride, oy, ox);
}

// A ReLU right after a pooling or linear layer runs inside it
// (CnnStepLaunch::relu): the forward writes the ReLU's output, and the backward
// takes the ReLU's output gradient through the ReLU as it reads it.
__device__ __forceinline__ float relu(float x) { return x > 0.f ? x : 0.f; }
__device__ __forceinline__ float through_relu(const float* relu_out, const float* g, int i) {
  return relu_out && !(relu_out[i] > 0.f) ? 0.f : g[i];
}

__device__ void max_pool_forward(const Block& b, const CnnLayer& L, const float* in, float* out, bool with_relu) {
  const int plane = L.out_h * L.out_w;
  for (int i = b.tid; i < L.out_c * plane; i += b.threads) {
    const float* p = in + (i / plane) * L.in_h * L.in_w;
    const float v = pool_window(p, L, (i % plane) / L.out_w, (i % plane) % L.out_w).value;
    out[i] = with_relu ? relu(v) : v;
  }
}

// dX: each input element gets the gradients of the windows whose argmax it
// is. Windows that do not overlap (stride = kernel) scatter: zero dX, then
// each window writes its one element.
template <class T>
__device__ void max_pool_backward(const Block& b, const CnnLayer& L, const float* gy, const float* in, float* g_in,
                                  const float* relu_out) {
  const int in_plane = L.in_h * L.in_w, k = L.kernel_h, s = L.stride;
  if (k == s) {
    for (int i = b.tid; i < L.in_c * in_plane; i += b.threads) g_in[i] = 0.f;
    __syncthreads();
    const int plane = L.out_h * L.out_w;
    for (int i = b.tid; i < L.out_c * plane; i += b.threads) {
      const int c = i / plane, oy = (i % plane) / L.out_w, ox = (i % plane) % L.out_w;
      g_in[c * in_plane + pool_window(in + c * in_plane, L, oy, ox).at] = through_relu(relu_out, gy, i);
    }
    return;
  }
  for (int i = b.tid; i < L.in_c * in_plane; i += b.threads) {
    const int c = i / in_plane, at = i % in_plane, iy = at / L.in_w, ix = at % L.in_w;
    const float* p = in + c * in_plane;
    const WindowRange<int> rows = windows_containing(iy, k, s, L.out_h), cols = windows_containing(ix, k, s, L.out_w);
    float sum = 0.f;
    for (int oy = rows.lo; oy <= rows.hi; ++oy)
      for (int ox = cols.lo; ox <= cols.hi; ++ox)
        if (pool_window(p, L, oy, ox).at == at) sum += through_relu(relu_out, gy, (c * L.out_h + oy) * L.out_w + ox);
    g_in[i] = rounded<T>(sum);
  }
}

// An activation layer other than relu over the example's n values (the
// math of activation.cuh, as the element-wise kernels), each result rounded
// to T. The backward reads the forward's input or output
// (backward_reads_input).
template <class T, Activation A>
__device__ void activation_forward_as(const Block& b, int n, const float* in, float* out) {
  for (int i = b.tid; i < n; i += b.threads) out[i] = rounded<T>(ActivationMath<A>::forward(in[i]));
}
template <class T, Activation A>
__device__ void activation_backward_as(const Block& b, int n, const float* gy, const float* in, const float* out,
                                       float* g_in) {
  const float* v = kBackwardReadsInput<A> ? in : out;
  for (int i = b.tid; i < n; i += b.threads) g_in[i] = rounded<T>(ActivationMath<A>::backward(gy[i], v[i]));
}

// The keep bit of element `i` of this example (dropout: per element of the
// [batch, features] tensor; dropout2d: per channel plane of [batch, C, H, W]).
__device__ __forceinline__ bool kept(const CnnLayer& L, int example, int i, std::int32_t step) {
  const int size = L.out_c * L.out_h * L.out_w;
  const std::int64_t element = L.op == CnnLayerOp::dropout
                                   ? std::int64_t(example) * size + i
                                   : std::int64_t(example) * L.out_c + i / (L.out_h * L.out_w);
  return philox::dropout_keep(L.dropout.seed, L.dropout.stream, step, element, L.dropout.threshold);
}

// out[j] = bias[j] + sum_i in[i] W[j][i]: a warp per output.
template <class T>
__device__ void linear_forward(const Block& b, const CnnLayer& L, const float* in, float* out, const T* weights,
                               const float* bias, bool with_relu) {
  const int n_in = L.in_c * L.in_h * L.in_w;
  for (int j = b.warp; j < L.out_c; j += b.warps) {
    float s = 0.f;
    for (int i = b.lane; i < n_in; i += 32) s += in[i] * from_compute<T>(weights[j * n_in + i]);
    s = warp_sum(s);
    if (b.lane == 0) out[j] = with_relu ? relu(rounded<T>(s + bias[j])) : rounded<T>(s + bias[j]);
  }
}

// The example's weight gradient is the outer product dZ x^T. With one
// example per block its two factors go to the example's row of the workspace
// (`factors`: dZ, then x) and the update kernel sums the products over the
// batch; with several, the block adds the product to its slice (dW, db), so
// the update kernel reads one sum per block instead of one pair per example.
template <class T>
__device__ void linear_backward(const Block& b, const CnnLayer& L, const float* gy, const float* in, float* g_in,
                                const T* weights, float* factors, float* dW, float* db, bool first,
                                const float* relu_out, float* masked) {
  const int n_in = L.in_c * L.in_h * L.in_w;
  if (relu_out) {  // the gradient through the ReLU once, for the loops below
    for (int j = b.tid; j < L.out_c; j += b.threads) masked[j] = through_relu(relu_out, gy, j);
    __syncthreads();
    gy = masked;
  }
  if (factors) {
    for (int j = b.tid; j < L.out_c; j += b.threads) factors[j] = gy[j];
    for (int i = b.tid; i < n_in; i += b.threads) factors[L.out_c + i] = in[i];
  } else {
    for (int j = b.warp; j < L.out_c; j += b.warps)
      for (int i = b.lane; i < n_in; i += 32) accumulate(dW + j * n_in + i, gy[j] * in[i], first);
    for (int j = b.tid; j < L.out_c; j += b.threads) accumulate(db + j, gy[j], first);
  }
  if (!L.input_gradient) return;
  for (int i = b.tid; i < n_in; i += b.threads) {
    float even = 0.f, odd = 0.f;  // two chains of adds in flight
    int j = 0;
    for (; j + 1 < L.out_c; j += 2) {
      even += gy[j] * from_compute<T>(weights[j * n_in + i]);
      odd += gy[j + 1] * from_compute<T>(weights[(j + 1) * n_in + i]);
    }
    if (j < L.out_c) even += gy[j] * from_compute<T>(weights[j * n_in + i]);
    g_in[i] = rounded<T>(even + odd);
  }
}

// One example's fetch (as launch_batch_fetch: x * scale + shift, rounded to
// T) into the input's place in shared memory; returns its label. The
// caller's barrier publishes the pixels.
template <class T>
__device__ int fetch_example(const Block& b, const CnnStepArgs& a, const CnnStepLaunch& l, std::int32_t step,
                             int example) {
  const CnnLayer& first = a.layer[0];
  const int pixels = first.in_c * first.in_h * first.in_w;
  const std::int64_t global = std::int64_t(a.batch) * a.ranks;  // as ref::batch_indices
  const std::int64_t row = a.perm[(std::int64_t(step) % (a.rows / global)) * global + std::int64_t(a.rank) * a.batch + example];
  const std::uint8_t* src = a.images + row * pixels;
  for (int i = b.tid; i < pixels; i += b.threads)
    b.smem[l.act_offset[0] + i] = rounded<T>(float(src[i]) * a.scale + a.shift);
  return a.labels[row];
}

}  // namespace
}  // namespace sg::cuda
