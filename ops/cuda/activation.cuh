#pragma once
// The activations' math on the device, in one place: the element-wise map
// kernels (elementwise.cu) and the fused kernels that apply an activation in
// their epilogue (small_batch_forward.cu, small_linear.cu's dgrad,
// output_layer_backward.cu, the one-pass dgrad_wgrad_*.cu) all call these.
// Math in f32, as the CPU reference (ops/cpu/reference_ops.hpp) computes it.
//   ActivationMath<A>::forward(x)        the activation of x
//   ActivationMath<A>::backward(dy, v)   dy * act'(x), where v is the value
//                                        the backward op reads: x itself for
//                                        gelu, gelu_tanh and silu, the
//                                        forward output y for relu, tanh and
//                                        sigmoid (activation.hpp)
#include "ops/cuda/activation.hpp"
#include "ops/cuda/launch_config.cuh"  // to_float

namespace sg::cuda {

__device__ inline float sigmoidf(float x) { return 1.f / (1.f + expf(-x)); }

template <Activation A>
struct ActivationMath;

template <>
struct ActivationMath<Activation::relu> {
  // (fmaxf: the instruction our kernels' ReLU epilogues always used; `x > 0 ? x : 0` compiles to the same max.f32)
  __device__ static float forward(float x) { return fmaxf(x, 0.f); }
  __device__ static float backward(float dy, float y) { return y > 0.f ? dy : 0.f; }
};

// A ReLU's backward where the kernel may have no ReLU (`has_relu` false: `grad` itself), with the
// ReLU's output `relu_out` (T) already read: ActivationMath<relu>::backward's rule (0 where the
// output is not positive, NaN too), written as the pooling kernels always computed it.
template <typename T>
__device__ __forceinline__ float relu_backward_if(float grad, bool has_relu, T relu_out) {
  return has_relu && !(to_float(relu_out) > 0.f) ? 0.f : grad;
}

// Exact GELU: x * Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2 (ref::gelu).
template <>
struct ActivationMath<Activation::gelu> {
  __device__ static float forward(float x) { return x * 0.5f * (1.f + erff(x * 0.70710678118654752f)); }
  __device__ static float backward(float dy, float x) {  // dy * (Phi(x) + x * phi(x))
    const float cdf = 0.5f * (1.f + erff(x * 0.70710678118654752f));
    const float pdf = 0.39894228040143268f * __expf(-0.5f * x * x);
    return dy * (cdf + x * pdf);
  }
};

// The tanh approximation, which cuBLASLt's GELU epilogues compute (ref::gelu_tanh).
template <>
struct ActivationMath<Activation::gelu_tanh> {
  __device__ static float forward(float x) {
    return 0.5f * x * (1.f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
  }
  __device__ static float backward(float dy, float x) {
    const float k = 0.79788456080286536f, c = 0.044715f;
    const float t = tanhf(k * (x + c * x * x * x));
    return dy * (0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * k * (1.f + 3.f * c * x * x));
  }
};

template <>
struct ActivationMath<Activation::silu> {
  __device__ static float forward(float x) { return x * sigmoidf(x); }
  __device__ static float backward(float dy, float x) {  // dy * s (1 + x (1 - s))
    const float s = sigmoidf(x);
    return dy * s * (1.f + x * (1.f - s));
  }
};

template <>
struct ActivationMath<Activation::tanh> {
  __device__ static float forward(float x) { return tanhf(x); }
  __device__ static float backward(float dy, float y) { return dy * (1.f - y * y); }
};

template <>
struct ActivationMath<Activation::sigmoid> {
  __device__ static float forward(float x) { return sigmoidf(x); }
  __device__ static float backward(float dy, float y) { return dy * y * (1.f - y); }
};

}  // namespace sg::cuda
