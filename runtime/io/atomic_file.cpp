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

// "PATH: cannot write (writing the temp file PATH.tmp.PID): No space left on device": the file asked
// for comes first, the temp file (which is what failed, and what a stray leftover is named) after it.
// `step` says what failed, "{}" standing for the temp file.
[[noreturn]] void fail_write(const std::filesystem::path& path, const std::filesystem::path& tmp, const char* step,
                             const std::string& reason) {
  throw IoError(fmt::format("{}: cannot write ({}): {}", path.string(), fmt::format(fmt::runtime(step), tmp.string()), reason));
}

// Removes the temp file after a failure, keeping `err` (errno of the failure) for the message.
std::string remove_after_failure(const std::filesystem::path& tmp, int err) {
  std::error_code ignored;
  std::filesystem::remove(tmp, ignored);
  return std::strerror(err);
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
  if (fd < 0) fail_write(path, tmp, "creating the temp file {}", std::strerror(errno));
  for (const std::string_view bytes : pieces) {
    std::size_t done = 0;
    while (done < bytes.size()) {
      const auto n = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0) {
        const int err = errno;
        ::close(fd);
        fail_write(path, tmp, "writing the temp file {}", remove_after_failure(tmp, err));
      }
      done += static_cast<std::size_t>(n);
    }
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    fail_write(path, tmp, "flushing the temp file {}", remove_after_failure(tmp, err));
  }
  if (::close(fd) != 0) fail_write(path, tmp, "closing the temp file {}", remove_after_failure(tmp, errno));
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    fail_write(path, tmp, "renaming the temp file {} over it", ec.message());
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
