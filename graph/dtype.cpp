#include "graph/dtype.hpp"

#include <stdexcept>
#include <string>

namespace sg {

namespace {
constexpr DType kAllDTypes[] = {DType::f32, DType::f16, DType::i32, DType::u8, DType::bf16};
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::u8: return "u8";
    case DType::bf16: return "bf16";
  }
  return "?";
}

DType dtype_from_name(std::string_view name) {
  for (DType d : kAllDTypes)
    if (dtype_name(d) == name) return d;
  throw std::invalid_argument("unknown dtype '" + std::string(name) + "' (expected f32, f16, bf16, i32 or u8)");
}

std::optional<DType> dtype_from_code(std::uint8_t code) {
  for (DType d : kAllDTypes)
    if (static_cast<std::uint8_t>(d) == code) return d;
  return std::nullopt;
}

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::i32: return 4;
    case DType::u8: return 1;
    case DType::bf16: return 2;
  }
  return 0;
}

bool is_floating(DType dtype) { return dtype == DType::f32 || is_half_width_float(dtype); }

bool is_half_width_float(DType dtype) { return dtype == DType::f16 || dtype == DType::bf16; }

}  // namespace sg
