#pragma once
// Test helper: a safetensors file as `stepgraph export` writes it
// (runtime/export/safetensors_writer.hpp), read back: its bytes, the 8-byte
// little-endian header length, the JSON header (tensors and __metadata__).
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/io/atomic_file.hpp"

namespace sg::test {

struct SafetensorsFile {
  std::string bytes;
  std::uint64_t header_len = 0;
  nlohmann::json header;
  // Tensor `name`'s bytes.
  std::string data(const std::string& name) const {
    REQUIRE(header.contains(name));
    const std::size_t begin = header[name]["data_offsets"][0], end = header[name]["data_offsets"][1];
    return bytes.substr(8 + header_len + begin, end - begin);
  }
  std::string module_code() const { return header["__metadata__"]["stepgraph.torch_module"]; }
  std::vector<float> floats(const std::string& name) const {
    const std::string raw = data(name);
    std::vector<float> v(raw.size() / sizeof(float));
    std::memcpy(v.data(), raw.data(), raw.size());
    return v;
  }
};

inline SafetensorsFile read_safetensors(const std::filesystem::path& path) {
  SafetensorsFile f{io::read_file(path), 0, {}};
  REQUIRE(f.bytes.size() >= 8);
  for (int i = 7; i >= 0; --i)
    f.header_len = (f.header_len << 8) | static_cast<unsigned char>(f.bytes[static_cast<std::size_t>(i)]);
  REQUIRE(8 + f.header_len <= f.bytes.size());
  f.header = nlohmann::json::parse(f.bytes.substr(8, f.header_len));
  return f;
}

}  // namespace sg::test
