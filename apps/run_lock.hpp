#pragma once
// A training run's claim on its output folder: the folders it had to create
// (removed again when the run fails before it writes an output), and an
// exclusive lock on the out_dir so two runs never write into one folder at once.
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace sg::app {

// Creates the missing folders of `dir` (and its missing parents); unless
// keep() is called, the destructor removes the folders it created, deepest
// first, as far as they are empty. A run that fails at start-up (bad data, a
// second run holding the lock, too little memory) so leaves no folder behind.
class NewFolders {
 public:
  NewFolders() = default;
  NewFolders(const NewFolders&) = delete;
  NewFolders& operator=(const NewFolders&) = delete;
  ~NewFolders();
  // Throws io::IoError naming `what` (e.g. "run.out_dir") and the folder.
  void create(const std::filesystem::path& dir, const std::string& what);
  void keep();  // the run wrote an output: its folders stay

 private:
  std::vector<std::filesystem::path> created_;  // parents before children
};

// An exclusive flock(2) on DIR/.stepgraph.lock, the file holding the owner's
// pid. The kernel drops the lock when its process dies (even by SIGKILL), so
// a stale file never blocks a later run. Released, and the file removed, on
// destruction.
class RunLock {
 public:
  // Throws RunLockBusy when another process holds the lock, IoError when the
  // lock file cannot be made.
  explicit RunLock(const std::filesystem::path& dir);
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;
  ~RunLock();

  static constexpr const char* kFileName = ".stepgraph.lock";

 private:
  std::filesystem::path path_;
  int fd_ = -1;
};

struct RunLockBusy : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// From a signal handler (async-signal-safe: unlink and rmdir only): removes
// the lock file a RunLock holds and the folders NewFolders created and has
// not been told to keep, for a process about to _exit during start-up.
void abandon_run_outputs_from_signal() noexcept;

}  // namespace sg::app
