#pragma once
// Storage of one graph value on the host. Floating values (f32 and f16 in the
// graph) are held in the executor's compute type T; integers as themselves.
#include <cstdint>
#include <vector>

#include "graph/value.hpp"

namespace sg {

template <typename T>
struct HostTensor {
  Shape shape;
  DType dtype = DType::f32;
  std::vector<T> real;            // f32 / f16 values
  std::vector<std::int32_t> i32;  // i32 values
  std::vector<std::uint8_t> u8;   // u8 values

  std::int64_t size() const { return element_count(shape); }
  std::int64_t rows() const { return shape.empty() ? 1 : shape[0]; }
  std::int64_t cols() const { return shape.size() < 2 ? 1 : shape[1]; }
};

}  // namespace sg
