// Element-wise kernels: one thread per 16-byte vector of elements when every
// pointer is 16-byte aligned, else one thread per element. Math in f32.
#include "ops/cuda/activation.cuh"
#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/kernels.hpp"
#include "ops/cuda/launch_config.cuh"

namespace sg::cuda {
namespace {

// The activations and their backwards: the math is ActivationMath's
// (activation.cuh), shared with the fused kernels. A backward reads (dy, x)
// for gelu, gelu_tanh and silu and (dy, y) for relu, tanh and sigmoid.
template <Activation A>
struct ActivationOp {
  __device__ float operator()(float x, float) const { return ActivationMath<A>::forward(x); }
};
template <Activation A>
struct ActivationBackwardOp {
  __device__ float operator()(float dy, float v) const { return ActivationMath<A>::backward(dy, v); }
};
using ReluOp = ActivationOp<Activation::relu>;
using ReluBackwardOp = ActivationBackwardOp<Activation::relu>;
using GeluOp = ActivationOp<Activation::gelu>;
using GeluBackwardOp = ActivationBackwardOp<Activation::gelu>;
using GeluTanhOp = ActivationOp<Activation::gelu_tanh>;
using GeluTanhBackwardOp = ActivationBackwardOp<Activation::gelu_tanh>;
using SiluOp = ActivationOp<Activation::silu>;
using SiluBackwardOp = ActivationBackwardOp<Activation::silu>;
using TanhOp = ActivationOp<Activation::tanh>;
using TanhBackwardOp = ActivationBackwardOp<Activation::tanh>;
using SigmoidOp = ActivationOp<Activation::sigmoid>;
using SigmoidBackwardOp = ActivationBackwardOp<Activation::sigmoid>;
struct AddOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// y[i] = op(a[i], b[i]) (b may be null for unary ops: it then reads a).
template <typename T, typename Op>
__global__ void map_vec_kernel(const T* a, const T* b, T* y, std::int64_t vectors, Op op) {
  for (std::int64_t v = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; v < vectors;
       v += std::int64_t(gridDim.x) * blockDim.x) {
    const Vec16<T> va = reinterpret_cast<const Vec16<T>*>(a)[v];
    const Vec16<T> vb = reinterpret_cast<const Vec16<T>*>(b)[v];
    Vec16<T> out;
#pragma unroll
    for (int k = 0; k < kVec<T>; ++k) out.v[k] = from_float<T>(op(to_float(va.v[k]), to_float(vb.v[k])));
    reinterpret_cast<Vec16<T>*>(y)[v] = out;
  }
}

template <typename T, typename Op>
__global__ void map_scalar_kernel(const T* a, const T* b, T* y, std::int64_t begin, std::int64_t n, Op op) {
  for (std::int64_t i = begin + blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    y[i] = from_float<T>(op(to_float(a[i]), to_float(b[i])));
}

template <typename T, typename Op>
void map(const T* a, const T* b, T* y, std::int64_t n, Op op, cudaStream_t stream, const char* name) {
  std::int64_t done = 0;
  if (aligned16(a) && aligned16(b) && aligned16(y)) {
    const std::int64_t vectors = n / kVec<T>;
    if (vectors > 0) {
      map_vec_kernel<<<blocks_for(vectors), kThreads, 0, stream>>>(a, b, y, vectors, op);
      SG_LAUNCH_CHECK(name);
    }
    done = vectors * kVec<T>;
  }
  if (done < n) {
    map_scalar_kernel<<<blocks_for(n - done), kThreads, 0, stream>>>(a, b, y, done, n, op);
    SG_LAUNCH_CHECK(name);
  }
}

template <typename T>
__global__ void bias_add_kernel(const T* x, const T* bias, std::int64_t rows, std::int64_t cols, T* y) {
  const std::int64_t n = rows * cols;
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    y[i] = from_float<T>(to_float(x[i]) + to_float(bias[i % cols]));
}

template <typename From, typename To>
__global__ void cast_kernel(const From* x, std::int64_t n, To* y) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    y[i] = from_float<To>(to_float(x[i]));
}

}  // namespace

template <typename T>
void launch_relu(const T* x, std::int64_t n, T* y, cudaStream_t stream) {
  map(x, x, y, n, ReluOp{}, stream, "relu");
}
template <typename T>
void launch_relu_backward(const T* dy, const T* y, std::int64_t n, T* dx, cudaStream_t stream) {
  map(dy, y, dx, n, ReluBackwardOp{}, stream, "relu_backward");
}
template <typename T>
void launch_gelu(const T* x, std::int64_t n, T* y, cudaStream_t stream) {
  map(x, x, y, n, GeluOp{}, stream, "gelu_kernel");
}
template <typename T>
void launch_gelu_backward(const T* dy, const T* x, std::int64_t n, T* dx, cudaStream_t stream) {
  map(dy, x, dx, n, GeluBackwardOp{}, stream, "gelu_backward_kernel");
}
#define SG_MAP_LAUNCHERS(fname, Fwd, Bwd)                                                     \
  template <typename T>                                                                        \
  void launch_##fname(const T* x, std::int64_t n, T* y, cudaStream_t stream) {                  \
    map(x, x, y, n, Fwd{}, stream, #fname "_kernel");                                          \
  }                                                                                            \
  template <typename T>                                                                        \
  void launch_##fname##_backward(const T* dy, const T* v, std::int64_t n, T* dx, cudaStream_t stream) { \
    map(dy, v, dx, n, Bwd{}, stream, #fname "_backward_kernel");                               \
  }
SG_MAP_LAUNCHERS(gelu_tanh, GeluTanhOp, GeluTanhBackwardOp)
SG_MAP_LAUNCHERS(silu, SiluOp, SiluBackwardOp)
SG_MAP_LAUNCHERS(tanh, TanhOp, TanhBackwardOp)
SG_MAP_LAUNCHERS(sigmoid, SigmoidOp, SigmoidBackwardOp)
#undef SG_MAP_LAUNCHERS
template <typename T>
void launch_add(const T* a, const T* b, std::int64_t n, T* y, cudaStream_t stream) {
  map(a, b, y, n, AddOp{}, stream, "add");
}
template <typename T>
void launch_bias_add(const T* x, const T* bias, std::int64_t rows, std::int64_t cols, T* y, cudaStream_t stream) {
  bias_add_kernel<<<blocks_for(rows * cols), kThreads, 0, stream>>>(x, bias, rows, cols, y);
  SG_LAUNCH_CHECK("bias_add_kernel");
}

void launch_cast(const float* x, std::int64_t n, __half* y, cudaStream_t stream) {
  cast_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, y);
  SG_LAUNCH_CHECK("cast_kernel f32->f16");
}
void launch_cast(const __half* x, std::int64_t n, float* y, cudaStream_t stream) {
  cast_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, y);
  SG_LAUNCH_CHECK("cast_kernel f16->f32");
}
void launch_cast(const float* x, std::int64_t n, __nv_bfloat16* y, cudaStream_t stream) {
  cast_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, y);
  SG_LAUNCH_CHECK("cast_kernel f32->bf16");
}
void launch_cast(const __nv_bfloat16* x, std::int64_t n, float* y, cudaStream_t stream) {
  cast_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, y);
  SG_LAUNCH_CHECK("cast_kernel bf16->f32");
}

#define SG_INSTANTIATE(T)                                                                              \
  template void launch_relu<T>(const T*, std::int64_t, T*, cudaStream_t);                              \
  template void launch_relu_backward<T>(const T*, const T*, std::int64_t, T*, cudaStream_t);           \
  template void launch_add<T>(const T*, const T*, std::int64_t, T*, cudaStream_t);                     \
  template void launch_gelu<T>(const T*, std::int64_t, T*, cudaStream_t);                              \
  template void launch_gelu_backward<T>(const T*, const T*, std::int64_t, T*, cudaStream_t);           \
  template void launch_gelu_tanh<T>(const T*, std::int64_t, T*, cudaStream_t);                         \
  template void launch_gelu_tanh_backward<T>(const T*, const T*, std::int64_t, T*, cudaStream_t);      \
  template void launch_silu<T>(const T*, std::int64_t, T*, cudaStream_t);                              \
  template void launch_silu_backward<T>(const T*, const T*, std::int64_t, T*, cudaStream_t);           \
  template void launch_tanh<T>(const T*, std::int64_t, T*, cudaStream_t);                              \
  template void launch_tanh_backward<T>(const T*, const T*, std::int64_t, T*, cudaStream_t);           \
  template void launch_sigmoid<T>(const T*, std::int64_t, T*, cudaStream_t);                           \
  template void launch_sigmoid_backward<T>(const T*, const T*, std::int64_t, T*, cudaStream_t);        \
  template void launch_bias_add<T>(const T*, const T*, std::int64_t, std::int64_t, T*, cudaStream_t);
SG_INSTANTIATE(float)
SG_INSTANTIATE(__half)
SG_INSTANTIATE(__nv_bfloat16)
#undef SG_INSTANTIATE

}  // namespace sg::cuda

namespace sg::cuda {
namespace {

template <typename T>
__global__ void fill_uniform_kernel(T* data, std::int64_t n, std::uint64_t seed, float lo, float hi) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x) {
    std::uint64_t z = seed + (static_cast<std::uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull;  // SplitMix64
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
    data[i] = from_float<T>(lo + (hi - lo) * u);
  }
}

}  // namespace

void launch_fill_uniform(__half* data, std::int64_t n, std::uint64_t seed, float lo, float hi, cudaStream_t stream) {
  fill_uniform_kernel<<<blocks_for(n), kThreads, 0, stream>>>(data, n, seed, lo, hi);
  SG_LAUNCH_CHECK("fill_uniform_kernel");
}
void launch_fill_uniform(float* data, std::int64_t n, std::uint64_t seed, float lo, float hi, cudaStream_t stream) {
  fill_uniform_kernel<<<blocks_for(n), kThreads, 0, stream>>>(data, n, seed, lo, hi);
  SG_LAUNCH_CHECK("fill_uniform_kernel");
}
void launch_fill_uniform(__nv_bfloat16* data, std::int64_t n, std::uint64_t seed, float lo, float hi, cudaStream_t stream) {
  fill_uniform_kernel<<<blocks_for(n), kThreads, 0, stream>>>(data, n, seed, lo, hi);
  SG_LAUNCH_CHECK("fill_uniform_kernel");
}

}  // namespace sg::cuda
