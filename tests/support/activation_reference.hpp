#pragma once
// Test helper: the CPU reference (ops/cpu/reference_ops.hpp, in f64) of each
// activation our fused kernels take (ops/cuda/activation.hpp), forward and
// backward, so the GPU tests of those kernels loop over all of them.
#include <array>
#include <cstdint>
#include <vector>

#include "ops/cpu/reference_ops.hpp"
#include "ops/cuda/activation.hpp"

namespace sg::test {

inline constexpr std::array<cuda::Activation, 6> kActivations = {
    cuda::Activation::relu, cuda::Activation::gelu,  cuda::Activation::gelu_tanh,
    cuda::Activation::silu, cuda::Activation::tanh, cuda::Activation::sigmoid};

inline std::vector<double> activation_forward(cuda::Activation a, const std::vector<double>& x) {
  std::vector<double> y(x.size());
  const auto n = std::int64_t(x.size());
  switch (a) {
    case cuda::Activation::relu: ref::relu(x.data(), n, y.data()); break;
    case cuda::Activation::gelu: ref::gelu(x.data(), n, y.data()); break;
    case cuda::Activation::gelu_tanh: ref::gelu_tanh(x.data(), n, y.data()); break;
    case cuda::Activation::silu: ref::silu(x.data(), n, y.data()); break;
    case cuda::Activation::tanh: ref::tanh(x.data(), n, y.data()); break;
    case cuda::Activation::sigmoid: ref::sigmoid(x.data(), n, y.data()); break;
  }
  return y;
}

// dx from dy and what the backward op reads: the forward input for gelu,
// gelu_tanh and silu, the forward output for relu, tanh and sigmoid.
inline std::vector<double> activation_backward(cuda::Activation a, const std::vector<double>& dy,
                                               const std::vector<double>& saved) {
  std::vector<double> dx(dy.size());
  const auto n = std::int64_t(dy.size());
  switch (a) {
    case cuda::Activation::relu: ref::relu_backward(dy.data(), saved.data(), n, dx.data()); break;
    case cuda::Activation::gelu: ref::gelu_backward(dy.data(), saved.data(), n, dx.data()); break;
    case cuda::Activation::gelu_tanh: ref::gelu_tanh_backward(dy.data(), saved.data(), n, dx.data()); break;
    case cuda::Activation::silu: ref::silu_backward(dy.data(), saved.data(), n, dx.data()); break;
    case cuda::Activation::tanh: ref::tanh_backward(dy.data(), saved.data(), n, dx.data()); break;
    case cuda::Activation::sigmoid: ref::sigmoid_backward(dy.data(), saved.data(), n, dx.data()); break;
  }
  return dx;
}

// A pre-activation z (as fp16 holds it) and the pair (activation output h =
// act(z) rounded to fp16, the value the backward reads), for kernels that
// read X = h and, for gelu, gelu_tanh and silu, also z.
struct ActivationInputs {
  std::vector<float> z, h, saved;
};
template <typename Half>
ActivationInputs activation_inputs(cuda::Activation a, const std::vector<float>& z_values) {
  ActivationInputs in;
  for (float v : z_values) in.z.push_back(static_cast<float>(static_cast<Half>(v)));
  const std::vector<double> h = activation_forward(a, std::vector<double>(in.z.begin(), in.z.end()));
  for (double v : h) in.h.push_back(static_cast<float>(static_cast<Half>(static_cast<float>(v))));
  in.saved = cuda::backward_reads_input(a) ? in.z : in.h;
  return in;
}

}  // namespace sg::test
