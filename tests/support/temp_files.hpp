#pragma once
// Test helpers for tests that write files: a fresh folder, whole-file writes,
// and the bytes of a gzip file.
#include <doctest/doctest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

namespace sg::test {

// A new folder under the system temp dir, named after the test.
inline std::filesystem::path fresh_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("stepgraph-test-" + name + "-" + std::to_string(std::random_device{}()));
  std::filesystem::create_directories(dir);
  return dir;
}

inline void write_file(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

// The decompressed bytes of a .gz file.
inline std::string gunzip(const std::filesystem::path& gz) {
  gzFile f = gzopen(gz.c_str(), "rb");
  REQUIRE(f != nullptr);
  std::string out;
  char buf[1 << 16];
  for (int n; (n = gzread(f, buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  gzclose(f);
  return out;
}

}  // namespace sg::test
