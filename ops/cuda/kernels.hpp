#pragma once
// Host launchers of our own element-wise kernels. Each implements exactly the
// contract of its twin in ops/cpu/reference_ops.hpp; all are asynchronous on
// `stream`, capturable into a CUDA graph, and check the launch. Pointers are
// device pointers. Scalars that may change between graph replays (learning
// rate, step counter) are read from device memory so no re-capture is needed.
// A launcher with a `dependent` parameter launches its kernel as a
// programmatic dependent of the stream's previous kernel when it is set and
// the GPU supports it (dependent_launch.cuh; BackendOptions::dependent_launch).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace sg::cuda {

// Device-resident scalars of one parameter update (sgd_update, adam_update, rmsprop_update): the
// learning rate (run state, changed by a schedule without re-capture) and what the fused SGD
// epilogues derive from it. Every update rule reads `lr`; the rest serve SGD written into W.
struct UpdateScalars {
  float lr;
  float momentum;
  float weight_decay;
  float neg_lr;               // -lr: cuBLASLt alpha of the fused weight-gradient matmul
  float one_minus_lr_wd;      // 1 - lr*wd: its beta when there is no momentum
  __half neg_lr_h;            // the same two for fp16 compute (scale type 16F)
  __half one_minus_lr_wd_h;
  __half momentum_h;
  __half one_h;
};
UpdateScalars make_update_scalars(float lr, float momentum, float weight_decay);

// ---- batch fetch: idx = perm[(step mod (n/batch))*batch + i], then rows of
// the u8 image table scaled (x*scale+shift) into half/bfloat16/float, and u8 labels into i32.
// With ranks > 1 (data parallel, issue 25): idx = perm[(step mod (n/G))*G + rank*batch + i],
// G = ranks*batch, this rank's slice of the global batch.
void launch_batch_fetch(const std::int32_t* perm, std::int64_t n, const std::int32_t* step,
                        std::int64_t batch, const std::uint8_t* images, std::int64_t cols,
                        float scale, float shift, __half* x_out, const std::uint8_t* labels,
                        std::int32_t* labels_out, cudaStream_t stream, std::int64_t rank = 0,
                        std::int64_t ranks = 1);
void launch_batch_fetch(const std::int32_t* perm, std::int64_t n, const std::int32_t* step,
                        std::int64_t batch, const std::uint8_t* images, std::int64_t cols,
                        float scale, float shift, float* x_out, const std::uint8_t* labels,
                        std::int32_t* labels_out, cudaStream_t stream, std::int64_t rank = 0,
                        std::int64_t ranks = 1);
void launch_batch_fetch(const std::int32_t* perm, std::int64_t n, const std::int32_t* step,
                        std::int64_t batch, const std::uint8_t* images, std::int64_t cols,
                        float scale, float shift, __nv_bfloat16* x_out, const std::uint8_t* labels,
                        std::int32_t* labels_out, cudaStream_t stream, std::int64_t rank = 0,
                        std::int64_t ranks = 1);
void launch_advance_step(std::int32_t* step, cudaStream_t stream);

// ---- element-wise (n elements, 16-byte vectorised where alignment allows)
template <typename T> void launch_relu(const T* x, std::int64_t n, T* y, cudaStream_t stream);
template <typename T> void launch_relu_backward(const T* dy, const T* y, std::int64_t n, T* dx, cudaStream_t stream);
template <typename T> void launch_gelu(const T* x, std::int64_t n, T* y, cudaStream_t stream);
template <typename T> void launch_gelu_backward(const T* dy, const T* x, std::int64_t n, T* dx, cudaStream_t stream);
// gelu_tanh / silu backwards read the forward input x, tanh / sigmoid backwards its output y.
template <typename T> void launch_gelu_tanh(const T* x, std::int64_t n, T* y, cudaStream_t stream);
template <typename T> void launch_gelu_tanh_backward(const T* dy, const T* x, std::int64_t n, T* dx, cudaStream_t stream);
template <typename T> void launch_silu(const T* x, std::int64_t n, T* y, cudaStream_t stream);
template <typename T> void launch_silu_backward(const T* dy, const T* x, std::int64_t n, T* dx, cudaStream_t stream);
template <typename T> void launch_tanh(const T* x, std::int64_t n, T* y, cudaStream_t stream);
template <typename T> void launch_tanh_backward(const T* dy, const T* y, std::int64_t n, T* dx, cudaStream_t stream);
template <typename T> void launch_sigmoid(const T* x, std::int64_t n, T* y, cudaStream_t stream);
template <typename T> void launch_sigmoid_backward(const T* dy, const T* y, std::int64_t n, T* dx, cudaStream_t stream);
template <typename T> void launch_add(const T* a, const T* b, std::int64_t n, T* y, cudaStream_t stream);
template <typename T> void launch_bias_add(const T* x, const T* bias, std::int64_t rows, std::int64_t cols, T* y, cudaStream_t stream);
void launch_cast(const float* x, std::int64_t n, __half* y, cudaStream_t stream);
void launch_cast(const __half* x, std::int64_t n, float* y, cudaStream_t stream);
void launch_cast(const float* x, std::int64_t n, __nv_bfloat16* y, cudaStream_t stream);
void launch_cast(const __nv_bfloat16* x, std::int64_t n, float* y, cudaStream_t stream);

// ---- loss: one kernel computes the mean cross-entropy (f32, deterministic:
// no atomics) and, when dlogits != nullptr, (softmax - onehot)/rows times
// gradient_scale (a loss backward's LossGradientAttrs::scale).
template <typename T>
void launch_softmax_xent(const T* logits, const std::int32_t* labels, std::int64_t rows, std::int64_t cols,
                         float* loss, T* dlogits, cudaStream_t stream, bool dependent, float gradient_scale = 1.f);
template <typename T>
void launch_count_correct(const T* logits, const std::int32_t* labels, std::int64_t rows, std::int64_t cols,
                          std::int32_t* correct, cudaStream_t stream);

// ---- reductions and updates
// y[j] = sum_i x[i,j], accumulated in f32.
template <typename T>
void launch_reduce_rows(const T* x, std::int64_t rows, std::int64_t cols, T* y, cudaStream_t stream, bool dependent);
// PyTorch SGD on n elements of w with gradient g (velocity may be null when momentum is 0).
template <typename W, typename G>
void launch_sgd_update(W* w, const G* g, W* velocity, std::int64_t n, const UpdateScalars* scalars, cudaStream_t stream);
// Bias gradient fused with its update: g[j] = sum_i dy[i,j] (f32 accumulate),
// then the SGD update of b[j] (and velocity[j]) as above. No gradient buffer.
// With advance_step set, the kernel also increments *advance_step (once).
template <typename W, typename G>
void launch_bias_grad_sgd(const G* dy, std::int64_t rows, std::int64_t cols, W* bias, W* velocity,
                          const UpdateScalars* scalars, cudaStream_t stream, bool dependent,
                          std::int32_t* advance_step = nullptr);
// Second half of a momentum update whose first half (v = momentum*v + g) a
// matmul already wrote: v += wd*w; w -= lr*v.
template <typename W>
void launch_momentum_finish(W* w, W* velocity, std::int64_t n, const UpdateScalars* scalars, cudaStream_t stream);

// Fills n elements with uniform values in [lo, hi) from a counter-based hash
// of (seed, index): never zeros, for scratch operands and tests.
void launch_fill_uniform(__half* data, std::int64_t n, std::uint64_t seed, float lo, float hi, cudaStream_t stream);
void launch_fill_uniform(float* data, std::int64_t n, std::uint64_t seed, float lo, float hi, cudaStream_t stream);
void launch_fill_uniform(__nv_bfloat16* data, std::int64_t n, std::uint64_t seed, float lo, float hi, cudaStream_t stream);

// Fills n elements with a NaN bit pattern (tests poison outputs with it).
void launch_poison(void* data, std::size_t bytes, cudaStream_t stream);

}  // namespace sg::cuda
