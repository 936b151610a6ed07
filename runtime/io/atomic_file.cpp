#include "runtime/io/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace sg::io {
namespace {

[[noreturn]] void fail(const std::filesystem::path& path, const std::string& what) {
  throw IoError(fmt::format("{}: {}: {}", path.string(), what, std::strerror(errno)));
}

void create_parent(const std::filesystem::path& dir, const std::filesystem::path& for_path) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir))
    throw IoError(fmt::format("{}: cannot create the folder {}: {}", for_path.string(), dir.string(),
                              ec ? ec.message() : "a file of that name is in the way"));
}

}  // namespace

void write_file_atomically(const std::filesystem::path& path, std::string_view bytes) {
  write_file_atomically(path, std::vector<std::string_view>{bytes});
}

void write_file_atomically(const std::filesystem::path& path, const std::vector<std::string_view>& pieces) {
  if (path.has_parent_path()) create_parent(path.parent_path(), path);
  const auto tmp = std::filesystem::path(fmt::format("{}.tmp.{}", path.string(), ::getpid()));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) fail(tmp, "cannot create");
  for (const std::string_view bytes : pieces) {
    std::size_t done = 0;
    while (done < bytes.size()) {
      const auto n = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0) {
        ::close(fd);
        std::filesystem::remove(tmp);
        fail(tmp, "write failed");
      }
      done += static_cast<std::size_t>(n);
    }
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    std::filesystem::remove(tmp);
    fail(tmp, "flush failed");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    throw IoError(fmt::format("{}: cannot replace: {}", path.string(), ec.message()));
  }
}

void check_writable_dir(const std::filesystem::path& dir, const std::string& what) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir))
    throw IoError(fmt::format("{} {}: cannot create the folder: {}", what, dir.string(),
                              ec ? ec.message() : "a file of that name is in the way"));
  const auto probe = dir / fmt::format(".stepgraph-probe.{}", ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw IoError(fmt::format("{} {}: cannot write into the folder: {}", what, dir.string(), std::strerror(errno)));
  ::close(fd);
  std::filesystem::remove(probe, ec);
}

void check_writable_file(const std::filesystem::path& path, const std::string& what) {
  if (path.empty()) throw IoError(fmt::format("{}: empty path", what));
  if (std::filesystem::is_directory(path))
    throw IoError(fmt::format("{} {}: is a folder, expected a file path", what, path.string()));
  check_writable_dir(path.has_parent_path() ? path.parent_path() : std::filesystem::path("."), what);
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(fmt::format("{}: cannot open for reading", path.string()));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace sg::io
