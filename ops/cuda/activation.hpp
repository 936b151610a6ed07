#pragma once
// The hidden-layer activations our fused kernels compute (issue 21), as a
// host-visible tag: a lowering picks the tag from the graph's activation op,
// the kernel takes it as a template argument (activation.cuh holds the math).
// Every activation's backward op reads one saved value beside the incoming
// gradient: the forward INPUT (the pre-activation) for gelu, gelu_tanh and
// silu, the forward OUTPUT for relu, tanh and sigmoid.
#include <cstdint>
#include <string_view>
#include <type_traits>

#if defined(__CUDACC__)
#define SG_ACTIVATION_HD __host__ __device__
#else
#define SG_ACTIVATION_HD
#endif

namespace sg::cuda {

enum class Activation : std::uint8_t { relu, gelu, gelu_tanh, silu, tanh, sigmoid };

// Whether the backward reads the forward input (then a fused forward must
// also write the pre-activation) rather than the forward output.
constexpr bool backward_reads_input(Activation a) {
  return a == Activation::gelu || a == Activation::gelu_tanh || a == Activation::silu;
}
// The same as a constant device code can read (a kernel's template argument).
template <Activation A>
inline constexpr bool kBackwardReadsInput = backward_reads_input(A);

// The forward op's name in the IR (graph/ops/*.cpp); its backward is "<name>_backward".
constexpr std::string_view activation_op_name(Activation a) {
  switch (a) {
    case Activation::relu: return "relu";
    case Activation::gelu: return "gelu";
    case Activation::gelu_tanh: return "gelu_tanh";
    case Activation::silu: return "silu";
    case Activation::tanh: return "tanh";
    case Activation::sigmoid: return "sigmoid";
  }
  return "?";
}

// Calls f(std::integral_constant<Activation, a>{}) for the runtime tag `a`:
// the one place a launcher turns the tag into a kernel instantiation, or a
// kernel (the fused CNN step's activation layers) into its math's.
// (nvcc's check of host calls from host-device code is off here: `f` is a
// host lambda in launchers and a device one in kernels.)
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <typename F>
SG_ACTIVATION_HD decltype(auto) with_activation(Activation a, F&& f) {
  using A = Activation;
  switch (a) {
    case A::gelu: return f(std::integral_constant<A, A::gelu>{});
    case A::gelu_tanh: return f(std::integral_constant<A, A::gelu_tanh>{});
    case A::silu: return f(std::integral_constant<A, A::silu>{});
    case A::tanh: return f(std::integral_constant<A, A::tanh>{});
    case A::sigmoid: return f(std::integral_constant<A, A::sigmoid>{});
    case A::relu: break;
  }
  return f(std::integral_constant<A, A::relu>{});
}

}  // namespace sg::cuda
