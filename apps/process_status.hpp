#pragma once
// A child process's wait status (waitpid) in words, and whether it failed:
// the rank supervisor's ranks and bench --torch's PyTorch side.
#include <fmt/format.h>
#include <sys/wait.h>

#include <cstring>
#include <string>

namespace sg::app {

inline std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return "stopped";
}

inline bool wait_failed(int status) { return !WIFEXITED(status) || WEXITSTATUS(status) != 0; }

}  // namespace sg::app
