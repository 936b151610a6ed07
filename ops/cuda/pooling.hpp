#pragma once
// Max pooling on the GPU (NCHW, square k x k windows at stride s, no padding,
// floored output: ref::max_pool2d), with the element-wise neighbours the CNN
// puts around it folded into the same launch:
//   forward:  [dropout2d ->] max_pool2d [-> relu]
//   backward: [relu_backward ->] max_pool2d_backward [-> dropout2d_backward]
// Every intermediate is rounded to T as the graph stores it, so a fused launch
// gives the bits of the unfused ops. Pointers to intermediates are optional:
// null when no node outside the launch reads that value, so it is never
// written. The step comes from the device step counter (as dropout's).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/dropout.hpp"

#if defined(__CUDACC__)
#define SG_POOL_HD __host__ __device__
#else
#define SG_POOL_HD
#endif

namespace sg::cuda {

// planes = N*C planes of h x w, pooled to oh() x ow().
struct PoolGeometry {
  std::int64_t planes = 1, h = 1, w = 1;
  std::int64_t kernel = 2, stride = 2;
  SG_POOL_HD std::int64_t oh() const { return (h - kernel) / stride + 1; }
  SG_POOL_HD std::int64_t ow() const { return (w - kernel) / stride + 1; }
};

// dropout2d's channel mask around the pooling: plane p (= n*C + c) is kept
// when Philox keeps "element" p (ref::dropout2d). `active` false: no dropout.
struct PlaneDropout {
  bool active = false;
  DropoutParams params;
};

// x [planes, h, w] -> pooled [planes, oh, ow].
//   dropped   (optional): dropout2d(x), the whole input-sized tensor;
//   pooled    (optional): max_pool2d of dropout2d(x) (or of x);
//   activated (optional): relu(pooled).
// `step` may be null when the dropout is inactive.
template <typename T>
void launch_max_pool2d_forward(const T* x, const std::int32_t* step, const PoolGeometry& g, const PlaneDropout& dropout,
                               T* dropped, T* pooled, T* activated, cudaStream_t stream);

// The tensors of a backward chain, dy [planes, oh, ow] -> dx [planes, h, w]:
//   [relu_backward(., relu_before)] -> max_pool2d_backward(., x)
//   -> [relu_backward(., relu_after)] -> [dropout2d_backward]
// (a relu before the pooling in the forward, conv -> relu -> pool, puts its
// relu_backward after the pooling's backward; one after it, pool -> relu,
// before). Intermediates are written only through non-null pointers.
template <typename T>
struct PoolBackwardTensors {
  const T* dy = nullptr;
  const T* relu_before = nullptr;  // the output of the relu after the pooling (optional)
  const T* x = nullptr;            // the pooling's input (after any dropout2d): the argmax
  const T* relu_after = nullptr;   // the output of the relu before the pooling (optional)
  T* relu_before_grad = nullptr;   // [planes, oh, ow], optional
  T* pool_grad = nullptr;          // [planes, h, w], optional unless it is the result
  T* relu_after_grad = nullptr;    // [planes, h, w], optional unless it is the result
  T* dx = nullptr;                 // the chain's result (one of the two above when nothing follows)
};

// Each incoming gradient goes to the FIRST maximum of its window in
// row-major order (ref::max_pool2d_argmax); overlapping windows add in
// (oy, ox) order, in f32. `step` may be null when the dropout is inactive.
template <typename T>
void launch_max_pool2d_backward(const PoolBackwardTensors<T>& t, const std::int32_t* step, const PoolGeometry& g,
                                const PlaneDropout& dropout, cudaStream_t stream);

}  // namespace sg::cuda
