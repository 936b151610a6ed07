#pragma once
// Element types a graph value can hold. The CUDA backend stores values in
// exactly this type; the CPU reference backend computes every floating value
// in its own precision (f32 or f64) and, by default in f32, rounds each f16 /
// bf16 value to its format after the node that writes it
// (runtime/cpu/cpu_executor.hpp), as the GPU stores it.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace sg {

// The numeric codes are stored in checkpoints: append new types at the end.
enum class DType : std::uint8_t { f32, f16, i32, u8, bf16 };

std::string_view dtype_name(DType dtype);
DType dtype_from_name(std::string_view name);  // throws std::invalid_argument
// The DType a stored code names, or nullopt for a code no DType has.
std::optional<DType> dtype_from_code(std::uint8_t code);
std::size_t dtype_size(DType dtype);
bool is_floating(DType dtype);
// f16 or bf16: the 16-bit floating types matmul inputs and activations use.
bool is_half_width_float(DType dtype);

}  // namespace sg
