#pragma once
// Nothing half-written: files are written to "<path>.tmp.<pid>", flushed and
// renamed over the target. Parent folders are created.
#include <filesystem>
#include <stdexcept>
#include <string_view>

namespace sg::io {

struct IoError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void write_file_atomically(const std::filesystem::path& path, std::string_view bytes);
std::string read_file(const std::filesystem::path& path);  // throws IoError naming the file

}  // namespace sg::io
