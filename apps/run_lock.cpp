#include "apps/run_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "runtime/io/atomic_file.hpp"

namespace sg::app {
namespace {

// Paths a signal handler may remove: copied into fixed buffers while armed,
// since the handler may not allocate or take locks.
struct SignalSafePath {
  std::atomic<bool> armed{false};
  const void* owner = nullptr;
  bool is_folder = false;
  std::array<char, PATH_MAX> path{};
};
std::array<SignalSafePath, 16> g_removable;

void arm(const void* owner, const std::filesystem::path& path, bool is_folder) {
  const std::string text = std::filesystem::absolute(path).string();
  if (text.size() >= PATH_MAX) return;  // not removable from a signal handler; the RAII path still removes it
  for (auto& slot : g_removable) {
    if (slot.armed.load() || slot.owner) continue;
    slot.owner = owner;
    slot.is_folder = is_folder;
    std::memcpy(slot.path.data(), text.c_str(), text.size() + 1);
    slot.armed.store(true);
    return;
  }
}

void disarm(const void* owner) {
  for (auto& slot : g_removable)
    if (slot.owner == owner) {
      slot.armed.store(false);
      slot.owner = nullptr;
    }
}

}  // namespace

void abandon_run_outputs_from_signal() noexcept {
  // The lock file first, then the folders deepest first (registered parents first).
  for (auto& slot : g_removable)
    if (slot.armed.load() && !slot.is_folder) ::unlink(slot.path.data());
  for (auto slot = g_removable.rbegin(); slot != g_removable.rend(); ++slot)
    if (slot->armed.load() && slot->is_folder) ::rmdir(slot->path.data());
}

NewFolders::~NewFolders() {
  disarm(this);
  std::error_code ec;
  for (auto dir = created_.rbegin(); dir != created_.rend(); ++dir)
    if (std::filesystem::is_empty(*dir, ec) && !ec) std::filesystem::remove(*dir, ec);
}

void NewFolders::create(const std::filesystem::path& dir, const std::string& what) {
  // The missing folders from the nearest existing ancestor down.
  std::vector<std::filesystem::path> missing;
  std::error_code ec;
  for (auto p = std::filesystem::absolute(dir).lexically_normal(); !p.empty() && !std::filesystem::exists(p, ec);
       p = p.parent_path()) {
    missing.insert(missing.begin(), p);
    if (p == p.parent_path()) break;
  }
  for (const auto& p : missing) {
    if (!std::filesystem::create_directory(p, ec) && ec)
      throw io::IoError(fmt::format("{} {}: cannot create the folder: {}", what, dir.string(), ec.message()));
    created_.push_back(p);
    arm(this, p, true);
  }
  io::check_writable_dir(dir, what);  // exists now: checks that it takes a new file
}

void NewFolders::keep() {
  disarm(this);
  created_.clear();
}

RunLock::RunLock(const std::filesystem::path& dir) : path_(dir / kFileName) {
  // A holder that releases unlinks the file first: a lock taken on an unlinked
  // file is no lock, so retry until the locked file is the one at path_.
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
      throw io::IoError(fmt::format("{}: cannot open the run's lock file: {}", path_.string(), std::strerror(errno)));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int error = errno;
      if (error == ENOLCK || error == EOPNOTSUPP || error == ENOSYS) {
        // A file system without locks (some network mounts): run unguarded rather than not at all.
        spdlog::warn("{}: this file system takes no file locks ({}): a second run into this folder would not be "
                     "refused",
                     path_.string(), std::strerror(error));
      } else {
        char text[32] = {};
        const auto n = ::pread(fd, text, sizeof text - 1, 0);
        ::close(fd);
        if (error != EWOULDBLOCK)
          throw io::IoError(fmt::format("{}: cannot lock the run's lock file: {}", path_.string(), std::strerror(error)));
        const std::string pid = n > 0 ? std::string(text, static_cast<std::size_t>(n)) : std::string("unknown");
        throw RunLockBusy(fmt::format("run.out_dir {}: another stepgraph train (pid {}) is writing into this folder; "
                                      "wait for it to end or choose another run.out_dir",
                                      dir.string(), pid.substr(0, pid.find_first_of("\n "))));
      }
    }
    struct stat held{}, now{};
    if (::fstat(fd, &held) == 0 && ::stat(path_.c_str(), &now) == 0 && held.st_ino == now.st_ino &&
        held.st_dev == now.st_dev) {
      fd_ = fd;
      break;
    }
    ::close(fd);  // unlinked by its last holder between our open and flock
  }
  if (fd_ < 0)
    throw io::IoError(fmt::format("{}: cannot take the run's lock file (it keeps being replaced)", path_.string()));
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    const int error = errno;
    ::unlink(path_.c_str());
    ::close(fd_);
    throw io::IoError(fmt::format("{}: cannot write the run's lock file: {}", path_.string(), std::strerror(error)));
  }
  arm(this, path_, false);
}

RunLock::~RunLock() {
  disarm(this);
  ::unlink(path_.c_str());  // before the unlock: a waiting run then opens a new file (see the constructor)
  ::close(fd_);
}

}  // namespace sg::app
