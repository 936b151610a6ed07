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

}  // namespace

void write_file_atomically(const std::filesystem::path& path, std::string_view bytes) {
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  const auto tmp = std::filesystem::path(fmt::format("{}.tmp.{}", path.string(), ::getpid()));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) fail(tmp, "cannot create");
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
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    std::filesystem::remove(tmp);
    fail(tmp, "flush failed");
  }
  std::filesystem::rename(tmp, path);
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(fmt::format("{}: cannot open for reading", path.string()));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace sg::io
