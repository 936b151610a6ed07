// Optimizer kernels and the column reduction behind bias gradients. The
// update follows PyTorch's SGD (dampening 0): g' = g + wd*w; with momentum
// v = momentum*v + g', w -= lr*v; else w -= lr*g'. Scalars come from device
// memory so a learning-rate change needs no graph re-capture.
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/dependent_launch.cuh"
#include "ops/cuda/kernels.hpp"
#include "ops/cuda/launch_config.cuh"
#include "ops/cuda/sgd_step.cuh"

namespace sg::cuda {
namespace {

template <typename W, typename G>
__global__ void sgd_kernel(W* w, const G* g, W* velocity, std::int64_t n, const UpdateScalars* scalars) {
  const UpdateScalars s = *scalars;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x) {
    float v = velocity ? to_float(velocity[i]) : 0.f;
    w[i] = from_float<W>(sgd_step(to_float(w[i]), to_float(g[i]), velocity ? &v : nullptr, s));
    if (velocity) velocity[i] = from_float<W>(v);
  }
}

template <typename W>
__global__ void momentum_finish_kernel(W* w, W* velocity, std::int64_t n, const UpdateScalars* scalars) {
  const UpdateScalars s = *scalars;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x) {
    const float wi = to_float(w[i]);
    const float v = to_float(velocity[i]) + s.weight_decay * wi;
    velocity[i] = from_float<W>(v);
    w[i] = from_float<W>(wi - s.lr * v);
  }
}

// Column sums of a [rows, cols] matrix: a 32 x Chains block covers 32
// columns; chain y adds rows y, y + Chains, ... in order, then the chains
// combine in chain order through shared memory. With `bias` set, the sum is
// the bias gradient and is applied at once. 8 chains up to 255 rows (the
// order the fused kernels at batch 16/32 share, bit for bit), 32 from 256
// (4x the loads in flight: 8 chains took 15 us for 1024 x 4096).
template <int Chains, typename W, typename G>
__global__ void column_sum_kernel(const G* x, std::int64_t rows, std::int64_t cols, G* sums, W* bias, W* velocity,
                                  const UpdateScalars* scalars, std::int32_t* advance_step) {
  wait_for_previous_kernel();  // (a dependent launch: x comes from the kernel before)
  allow_next_kernel_to_start();
  if (advance_step && blockIdx.x == 0 && threadIdx.x == 0 && threadIdx.y == 0) *advance_step += 1;
  __shared__ float partial[Chains][33];
  const std::int64_t col = blockIdx.x * 32 + threadIdx.x;
  float acc = 0.f;
  if (col < cols)
#pragma unroll 8
    for (std::int64_t r = threadIdx.y; r < rows; r += Chains) acc += to_float(x[r * cols + col]);
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || col >= cols) return;
  float total = 0.f;
  for (int y = 0; y < Chains; ++y) total += partial[y][threadIdx.x];
  if (sums) sums[col] = from_float<G>(total);
  if (bias) {
    float v = velocity ? to_float(velocity[col]) : 0.f;
    bias[col] = from_float<W>(sgd_step(to_float(bias[col]), total, velocity ? &v : nullptr, *scalars));
    if (velocity) velocity[col] = from_float<W>(v);
  }
}

constexpr std::int64_t kManyRows = 256;

template <typename W, typename G>
void column_sum(const G* x, std::int64_t rows, std::int64_t cols, G* sums, W* bias, W* velocity,
                const UpdateScalars* scalars, cudaStream_t stream, bool dependent, std::int32_t* advance_step = nullptr) {
  const unsigned blocks = static_cast<unsigned>((cols + 31) / 32);
  if (rows >= kManyRows)
    launch_dependent(column_sum_kernel<32, W, G>, {dim3(blocks), dim3(32, 32)}, stream, dependent, x, rows, cols, sums,
                     bias, velocity, scalars, advance_step);
  else
    launch_dependent(column_sum_kernel<8, W, G>, {dim3(blocks), dim3(32, 8)}, stream, dependent, x, rows, cols, sums,
                     bias, velocity, scalars, advance_step);
}

}  // namespace

UpdateScalars make_update_scalars(float lr, float momentum, float weight_decay) {
  UpdateScalars s{};
  s.lr = lr;
  s.momentum = momentum;
  s.weight_decay = weight_decay;
  s.neg_lr = -lr;
  s.one_minus_lr_wd = 1.0f - lr * weight_decay;
  s.neg_lr_h = __float2half(-lr);
  s.one_minus_lr_wd_h = __float2half(1.0f - lr * weight_decay);
  s.momentum_h = __float2half(momentum);
  s.one_h = __float2half(1.0f);
  return s;
}

template <typename T>
void launch_reduce_rows(const T* x, std::int64_t rows, std::int64_t cols, T* y, cudaStream_t stream, bool dependent) {
  column_sum<T, T>(x, rows, cols, y, nullptr, nullptr, nullptr, stream, dependent);
}

template <typename W, typename G>
void launch_sgd_update(W* w, const G* g, W* velocity, std::int64_t n, const UpdateScalars* scalars, cudaStream_t stream) {
  sgd_kernel<<<blocks_for(n), kThreads, 0, stream>>>(w, g, velocity, n, scalars);
  SG_LAUNCH_CHECK("sgd_kernel");
}

template <typename W, typename G>
void launch_bias_grad_sgd(const G* dy, std::int64_t rows, std::int64_t cols, W* bias, W* velocity,
                          const UpdateScalars* scalars, cudaStream_t stream, bool dependent,
                          std::int32_t* advance_step) {
  column_sum<W, G>(dy, rows, cols, nullptr, bias, velocity, scalars, stream, dependent, advance_step);
}

template <typename W>
void launch_momentum_finish(W* w, W* velocity, std::int64_t n, const UpdateScalars* scalars, cudaStream_t stream) {
  momentum_finish_kernel<<<blocks_for(n), kThreads, 0, stream>>>(w, velocity, n, scalars);
  SG_LAUNCH_CHECK("momentum_finish_kernel");
}

template void launch_reduce_rows<float>(const float*, std::int64_t, std::int64_t, float*, cudaStream_t, bool);
template void launch_reduce_rows<__half>(const __half*, std::int64_t, std::int64_t, __half*, cudaStream_t, bool);
template void launch_sgd_update<__half, __half>(__half*, const __half*, __half*, std::int64_t, const UpdateScalars*, cudaStream_t);
template void launch_sgd_update<float, float>(float*, const float*, float*, std::int64_t, const UpdateScalars*, cudaStream_t);
template void launch_sgd_update<float, __half>(float*, const __half*, float*, std::int64_t, const UpdateScalars*, cudaStream_t);
template void launch_bias_grad_sgd<__half, __half>(const __half*, std::int64_t, std::int64_t, __half*, __half*, const UpdateScalars*, cudaStream_t, bool, std::int32_t*);
template void launch_bias_grad_sgd<float, float>(const float*, std::int64_t, std::int64_t, float*, float*, const UpdateScalars*, cudaStream_t, bool, std::int32_t*);
template void launch_bias_grad_sgd<float, __half>(const __half*, std::int64_t, std::int64_t, float*, float*, const UpdateScalars*, cudaStream_t, bool, std::int32_t*);
template void launch_momentum_finish<__half>(__half*, __half*, std::int64_t, const UpdateScalars*, cudaStream_t);
template void launch_momentum_finish<float>(float*, float*, std::int64_t, const UpdateScalars*, cudaStream_t);
// bf16 compute: bf16 weights, or fp32 master weights with bf16 gradients.
template void launch_reduce_rows<__nv_bfloat16>(const __nv_bfloat16*, std::int64_t, std::int64_t, __nv_bfloat16*, cudaStream_t, bool);
template void launch_sgd_update<__nv_bfloat16, __nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*, std::int64_t, const UpdateScalars*, cudaStream_t);
template void launch_sgd_update<float, __nv_bfloat16>(float*, const __nv_bfloat16*, float*, std::int64_t, const UpdateScalars*, cudaStream_t);
template void launch_bias_grad_sgd<__nv_bfloat16, __nv_bfloat16>(const __nv_bfloat16*, std::int64_t, std::int64_t, __nv_bfloat16*, __nv_bfloat16*, const UpdateScalars*, cudaStream_t, bool, std::int32_t*);
template void launch_bias_grad_sgd<float, __nv_bfloat16>(const __nv_bfloat16*, std::int64_t, std::int64_t, float*, float*, const UpdateScalars*, cudaStream_t, bool, std::int32_t*);
template void launch_momentum_finish<__nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16*, std::int64_t, const UpdateScalars*, cudaStream_t);

}  // namespace sg::cuda
