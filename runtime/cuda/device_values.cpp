#include "runtime/cuda/device_values.hpp"

#include <fmt/format.h>

#include "ops/cuda/cuda_check.hpp"

namespace sg::cuda {

DeviceBuffer& DeviceValues::get_or_create(const Value& v) {
  const auto bytes = value_bytes(v);
  auto it = buffers_.find(v.name);
  if (it == buffers_.end()) {
    it = buffers_.emplace(v.name, DeviceBuffer(bytes)).first;
    it->second.fill_bytes(0);
  }
  if (it->second.bytes() != bytes)
    throw CudaError(fmt::format("device value '{}' holds {} bytes, {} needs {}", v.name, it->second.bytes(),
                                shape_string(v.shape), bytes));
  return it->second;
}

DeviceBuffer& DeviceValues::at(const std::string& name) {
  auto it = buffers_.find(name);
  if (it == buffers_.end()) throw CudaError(fmt::format("no device buffer named '{}'", name));
  return it->second;
}

}  // namespace sg::cuda
