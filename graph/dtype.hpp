#pragma once
// Element types a graph value can hold. The CUDA backend stores values in
// exactly this type; the CPU reference backend computes every floating value
// in its own precision (f32 or f64) and ignores the f16/f32 distinction.
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace sg {

enum class DType : std::uint8_t { f32, f16, i32, u8 };

std::string_view dtype_name(DType dtype);
DType dtype_from_name(std::string_view name);  // throws std::invalid_argument
std::size_t dtype_size(DType dtype);
bool is_floating(DType dtype);

}  // namespace sg
