#include "runtime/tensor_blob.hpp"

#include <cstring>

#include <fmt/format.h>

#include "runtime/half_width_floats.hpp"

namespace sg {

std::uint16_t float_to_half_bits(float value) {
  const _Float16 h = static_cast<_Float16>(value);
  std::uint16_t bits;
  std::memcpy(&bits, &h, sizeof bits);
  return bits;
}

float half_bits_to_float(std::uint16_t bits) {
  _Float16 h;
  std::memcpy(&h, &bits, sizeof bits);
  return static_cast<float>(h);
}

io::TensorBlob blob_from_floats(std::string name, Shape shape, DType dtype, const std::vector<float>& values) {
  io::TensorBlob blob{std::move(name), dtype, std::move(shape), {}};
  if (dtype == DType::f32) {
    blob.bytes.assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  } else if (dtype == DType::f16) {
    std::vector<std::uint16_t> halves(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) halves[i] = float_to_half_bits(values[i]);
    blob.bytes.assign(reinterpret_cast<const char*>(halves.data()), halves.size() * sizeof(std::uint16_t));
  } else if (dtype == DType::bf16) {
    std::vector<std::uint16_t> bf16s(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) bf16s[i] = float_to_bf16_bits(values[i]);
    blob.bytes.assign(reinterpret_cast<const char*>(bf16s.data()), bf16s.size() * sizeof(std::uint16_t));
  } else {
    throw std::invalid_argument(fmt::format("blob '{}': {} is not a floating dtype", blob.name, dtype_name(dtype)));
  }
  return blob;
}

std::vector<float> floats_from_blob(const io::TensorBlob& blob) {
  const auto n = static_cast<std::size_t>(element_count(blob.shape));
  if (blob.bytes.size() != n * dtype_size(blob.dtype))
    throw std::invalid_argument(fmt::format("blob '{}' holds {} bytes, its shape {} {} needs {}", blob.name,
                                            blob.bytes.size(), shape_string(blob.shape), dtype_name(blob.dtype),
                                            n * dtype_size(blob.dtype)));
  std::vector<float> out(n);
  if (blob.dtype == DType::f32) {
    std::memcpy(out.data(), blob.bytes.data(), n * sizeof(float));
  } else if (blob.dtype == DType::f16) {
    for (std::size_t i = 0; i < n; ++i) {
      std::uint16_t bits;
      std::memcpy(&bits, blob.bytes.data() + 2 * i, 2);
      out[i] = half_bits_to_float(bits);
    }
  } else if (blob.dtype == DType::bf16) {
    for (std::size_t i = 0; i < n; ++i) {
      std::uint16_t bits;
      std::memcpy(&bits, blob.bytes.data() + 2 * i, 2);
      out[i] = bf16_bits_to_float(bits);
    }
  } else {
    throw std::invalid_argument(fmt::format("blob '{}' is {}, not floating", blob.name, dtype_name(blob.dtype)));
  }
  return out;
}

io::TensorBlob step_blob(std::int64_t step) {
  const auto value = static_cast<std::int32_t>(step);
  return {kStepEntry, DType::i32, {1}, std::string(reinterpret_cast<const char*>(&value), sizeof value)};
}

std::int64_t step_from_blobs(const std::vector<io::TensorBlob>& blobs) {
  for (const auto& b : blobs)
    if (b.name == kStepEntry && b.dtype == DType::i32 && b.bytes.size() == 4) {
      std::int32_t value;
      std::memcpy(&value, b.bytes.data(), 4);
      return value;
    }
  throw std::invalid_argument("state has no i32 'step' entry");
}

}  // namespace sg
