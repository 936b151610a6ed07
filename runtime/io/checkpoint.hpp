#pragma once
// Training checkpoints: named tensors (raw bytes, so resume is bit-exact in any
// dtype) + step + RNG/epoch state + the resolved config, in one binary file
// with a magic, a version and a CRC-32 over everything, written atomically.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "graph/dtype.hpp"
#include "graph/value.hpp"

namespace sg::io {

struct TensorBlob {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  std::string bytes;  // element_count(shape) * dtype_size(dtype) bytes

  bool operator==(const TensorBlob&) const = default;
};

struct Checkpoint {
  std::int64_t step = 0;
  std::uint64_t data_seed = 0;   // shuffle seed; the permutation of epoch e is derived from it
  std::string config_yaml;
  std::vector<TensorBlob> tensors;  // parameters, then optimizer state

  bool operator==(const Checkpoint&) const = default;
  const TensorBlob& tensor(const std::string& name) const;  // throws IoError
};

void save_checkpoint(const std::filesystem::path& path, const Checkpoint& checkpoint);
// Throws IoError naming the file on a bad magic, version, size or checksum.
Checkpoint load_checkpoint(const std::filesystem::path& path);

}  // namespace sg::io
