#include "runtime/data/data_file_checks.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include <fmt/format.h>

namespace sg::data {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(const std::string& key, const std::string& path, const std::string& what) {
  throw DataFileError(fmt::format("{} {}: {}", key, path, what));
}

// The type of what `path` names (not_found for nothing); `problem` is set when it cannot be looked at.
fs::file_type type_of(const fs::path& path, std::string& problem) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (status.type() == fs::file_type::none) problem = ec.message();
  return status.type();
}

// Up to 512 bytes from the start of a file; `problem` is set when it cannot be read.
std::string head_of(const fs::path& path, std::string& problem) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) {
    problem = std::strerror(errno);
    return {};
  }
  char buffer[512];
  const auto n = ::read(fd, buffer, sizeof buffer);
  if (n < 0) problem = std::strerror(errno);
  ::close(fd);
  return n < 0 ? std::string() : std::string(buffer, static_cast<std::size_t>(n));
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

const char* kind_text(FileKind kind) {
  switch (kind) {
    case FileKind::npy: return "is a .npy array";
    case FileKind::zip: return "is a zip archive (an .npz?)";
    case FileKind::gzip: return "is gzip-compressed (decompress it first)";
    case FileKind::text: return "holds text (a CSV table?)";
    default: return "is binary data";
  }
}

// One data.train_x-style key: a file of the kind `format` reads there.
void check_data_file(const std::string& key, const std::string& text, const std::string& format, bool guessed) {
  const std::string file = referenced_file(text);
  std::string problem;
  const fs::file_type type = type_of(file, problem);
  if (!problem.empty()) fail(key, file, "cannot read: " + problem);
  if (type == fs::file_type::not_found) return;
  if (type == fs::file_type::directory) fail(key, file, "is a folder, expected a file");
  const std::string head = head_of(file, problem);
  if (!problem.empty()) fail(key, file, "cannot read: " + problem);
  const FileKind kind = sniff_file_kind(head);
  if (kind == FileKind::empty) fail(key, file, "the file is empty");
  if (kind == FileKind::other_binary) return;  // the reader says what is wrong with it
  const bool npz = ends_with(file, ".npz");
  const FileKind expected = format == "csv" ? FileKind::text : npz ? FileKind::zip : FileKind::npy;
  if (kind == expected) return;
  const std::string wanted = format == "csv" ? "a CSV table" : npz ? "an .npz archive" : "a .npy array";
  const std::string says = guessed ? fmt::format("data.format {} (guessed from data.train_x's extension)", format)
                                   : fmt::format("data.format: {}", format);
  std::string fix;
  if (kind == FileKind::text) fix = ": for a CSV table set data.format: csv and data.label_column";
  else if (format == "csv") fix = ": for NumPy arrays set data.format: npy (labels: data.train_y)";
  else if (kind == FileKind::zip) fix = ": an .npz archive needs a name ending in .npz (file.npz or file.npz:array)";
  else if (kind == FileKind::npy) fix = ": a .npy array needs a name ending in .npy";
  fail(key, file, fmt::format("{}, but {} reads {} here{}", kind_text(kind), says, wanted, fix));
}

// data.dir: a folder whose IDX files can be read.
void check_idx_dir(const std::string& dir) {
  const std::string key = "data.dir";
  std::string problem;
  const fs::file_type type = type_of(dir, problem);
  if (!problem.empty()) fail(key, dir, "cannot read: " + problem);
  if (type == fs::file_type::not_found) return;
  if (type != fs::file_type::directory)
    fail(key, dir, "is a file, expected the folder of the four IDX files (for .npy/.npz or CSV data set data.train_x)");
  for (const char* name : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                           "t10k-labels-idx1-ubyte"})
    for (const std::string& candidate : {std::string(name) + ".gz", std::string(name)}) {
      const fs::path path = fs::path(dir) / candidate;
      const fs::file_type file_type = type_of(path, problem);
      if (problem.empty() && file_type == fs::file_type::not_found) continue;
      if (problem.empty() && file_type == fs::file_type::directory) problem = "it is a folder";
      if (problem.empty()) head_of(path, problem);
      if (!problem.empty()) fail(key, dir, fmt::format("cannot read {}: {}", candidate, problem));
      break;  // as the reader does: the .gz when there is one
    }
}

}  // namespace

FileKind sniff_file_kind(std::string_view head) {
  if (head.empty()) return FileKind::empty;
  if (head.substr(0, 6) == std::string_view("\x93NUMPY", 6)) return FileKind::npy;
  const auto zip = head.substr(0, 4);
  if (zip == std::string_view("PK\x03\x04", 4) || zip == std::string_view("PK\x05\x06", 4)) return FileKind::zip;
  if (head.substr(0, 2) == std::string_view("\x1f\x8b", 2)) return FileKind::gzip;
  if (head.find('\0') == std::string_view::npos) return FileKind::text;
  return FileKind::other_binary;
}

void check_data_paths(const DatasetFiles& f, const std::string& format) {
  if (format == "idx") {
    check_idx_dir(f.dir);
    return;
  }
  const bool guessed = f.format.empty();
  std::vector<std::pair<const char*, const std::string*>> keys = {{"data.train_x", &f.train_x}, {"data.test_x", &f.test_x}};
  if (format == "npy") {  // with csv the loader refuses data.train_y / data.test_y themselves
    keys.emplace_back("data.train_y", &f.train_y);
    keys.emplace_back("data.test_y", &f.test_y);
  }
  for (const auto& [key, text] : keys)
    if (!text->empty()) check_data_file(key, *text, format, guessed);
}

}  // namespace sg::data
