#pragma once
// Device buffers of graph-owned values (parameters, optimizer state, dataset
// tables), looked up by name so two programs (training step and evaluation)
// can share the same parameter buffers.
#include <map>
#include <string>

#include "graph/value.hpp"
#include "ops/cuda/cuda_resources.hpp"

namespace sg::cuda {

class DeviceValues {
 public:
  // The buffer for `v`, created (zero-filled) on first use; throws if an
  // existing buffer of that name has another size.
  DeviceBuffer& get_or_create(const Value& v);
  DeviceBuffer& at(const std::string& name);  // throws if absent
  bool contains(const std::string& name) const { return buffers_.count(name) != 0; }

 private:
  std::map<std::string, DeviceBuffer> buffers_;
};

}  // namespace sg::cuda
