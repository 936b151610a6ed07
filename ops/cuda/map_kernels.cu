#include "ops/cuda/map_kernels.hpp"

#include <array>
#include <utility>

#include "ops/cuda/kernels.hpp"

namespace sg::cuda {
namespace {

// Adapters from the launchers in kernels.hpp to the table's signature.
template <typename T, void (*Launch)(const T*, std::int64_t, T*, cudaStream_t)>
void unary(const T* a, const T*, std::int64_t n, T* y, cudaStream_t stream) {
  Launch(a, n, y, stream);
}
template <typename T, void (*Launch)(const T*, const T*, std::int64_t, T*, cudaStream_t)>
void binary(const T* a, const T* b, std::int64_t n, T* y, cudaStream_t stream) {
  Launch(a, b, n, y, stream);
}

const std::array kTable = {
    std::pair{std::string_view("relu"),
              MapKernels{1, unary<float, launch_relu<float>>, unary<__half, launch_relu<__half>>,
                         unary<__nv_bfloat16, launch_relu<__nv_bfloat16>>}},
    std::pair{std::string_view("relu_backward"),
              MapKernels{2, binary<float, launch_relu_backward<float>>, binary<__half, launch_relu_backward<__half>>,
                         binary<__nv_bfloat16, launch_relu_backward<__nv_bfloat16>>}},
    std::pair{std::string_view("add"), MapKernels{2, binary<float, launch_add<float>>, binary<__half, launch_add<__half>>,
                                                      binary<__nv_bfloat16, launch_add<__nv_bfloat16>>}},
    std::pair{std::string_view("gelu"),
              MapKernels{1, unary<float, launch_gelu<float>>, unary<__half, launch_gelu<__half>>,
                         unary<__nv_bfloat16, launch_gelu<__nv_bfloat16>>}},
    std::pair{std::string_view("gelu_backward"),
              MapKernels{2, binary<float, launch_gelu_backward<float>>, binary<__half, launch_gelu_backward<__half>>,
                         binary<__nv_bfloat16, launch_gelu_backward<__nv_bfloat16>>}},
    std::pair{std::string_view("gelu_tanh"),
              MapKernels{1, unary<float, launch_gelu_tanh<float>>, unary<__half, launch_gelu_tanh<__half>>,
                         unary<__nv_bfloat16, launch_gelu_tanh<__nv_bfloat16>>}},
    std::pair{std::string_view("gelu_tanh_backward"),
              MapKernels{2, binary<float, launch_gelu_tanh_backward<float>>, binary<__half, launch_gelu_tanh_backward<__half>>,
                         binary<__nv_bfloat16, launch_gelu_tanh_backward<__nv_bfloat16>>}},
    std::pair{std::string_view("silu"),
              MapKernels{1, unary<float, launch_silu<float>>, unary<__half, launch_silu<__half>>,
                         unary<__nv_bfloat16, launch_silu<__nv_bfloat16>>}},
    std::pair{std::string_view("silu_backward"),
              MapKernels{2, binary<float, launch_silu_backward<float>>, binary<__half, launch_silu_backward<__half>>,
                         binary<__nv_bfloat16, launch_silu_backward<__nv_bfloat16>>}},
    std::pair{std::string_view("tanh"),
              MapKernels{1, unary<float, launch_tanh<float>>, unary<__half, launch_tanh<__half>>,
                         unary<__nv_bfloat16, launch_tanh<__nv_bfloat16>>}},
    std::pair{std::string_view("tanh_backward"),
              MapKernels{2, binary<float, launch_tanh_backward<float>>, binary<__half, launch_tanh_backward<__half>>,
                         binary<__nv_bfloat16, launch_tanh_backward<__nv_bfloat16>>}},
    std::pair{std::string_view("sigmoid"),
              MapKernels{1, unary<float, launch_sigmoid<float>>, unary<__half, launch_sigmoid<__half>>,
                         unary<__nv_bfloat16, launch_sigmoid<__nv_bfloat16>>}},
    std::pair{std::string_view("sigmoid_backward"),
              MapKernels{2, binary<float, launch_sigmoid_backward<float>>, binary<__half, launch_sigmoid_backward<__half>>,
                         binary<__nv_bfloat16, launch_sigmoid_backward<__nv_bfloat16>>}},
};

}  // namespace

const MapKernels* find_map_kernels(std::string_view op) {
  for (const auto& [name, kernels] : kTable)
    if (name == op) return &kernels;
  return nullptr;
}

}  // namespace sg::cuda
