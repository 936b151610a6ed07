#include "apps/rank_supervisor.hpp"

#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "apps/config/train_config.hpp"
#include "apps/process_status.hpp"

namespace sg::app {
namespace {

using Clock = std::chrono::steady_clock;

// A TCP port nobody listens on now (the kernel picks it), for rank 0.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw ConfigError(fmt::format("--gpus: cannot open a socket to pick a port ({})", std::strerror(errno)));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  if (port <= 0) throw ConfigError("--gpus: cannot pick a free TCP port for the rendezvous (use --master-port)");
  return port;
}

struct Child {
  pid_t pid = -1;
  bool running = false;
  int status = 0;
};

pid_t start_rank(const std::string& program, const std::vector<std::string>& args) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(program.c_str()));
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  // A stop signal that reaches the child before its exec must end it, not run
  // the supervisor's handler in it: blocked across the fork, default in the child.
  sigset_t stops, before;
  sigemptyset(&stops);
  sigaddset(&stops, SIGINT);
  sigaddset(&stops, SIGTERM);
  ::sigprocmask(SIG_BLOCK, &stops, &before);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::sigprocmask(SIG_SETMASK, &before, nullptr);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // no rank outlives its supervisor
    if (::getppid() != parent) ::_exit(1);
    ::execv(program.c_str(), argv.data());
    std::fprintf(stderr, "stepgraph: cannot start a rank: execv failed (%s)\n", std::strerror(errno));
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::sigprocmask(SIG_SETMASK, &before, nullptr);
  if (pid < 0) throw ConfigError(fmt::format("--gpus: fork failed ({})", std::strerror(fork_errno)));
  return pid;
}

// Reaps whichever children ended; returns how many are still running.
int reap(std::vector<Child>& children, int& first_failure, std::string& why) {
  int running = 0;
  for (std::size_t r = 0; r < children.size(); ++r) {
    Child& c = children[r];
    if (!c.running) continue;
    const pid_t done = ::waitpid(c.pid, &c.status, WNOHANG);
    if (done == c.pid) {
      c.running = false;
      if (wait_failed(c.status) && first_failure < 0) {
        first_failure = static_cast<int>(r);
        why = describe_wait_status(c.status);
      }
    } else {
      ++running;
    }
  }
  return running;
}

void stop_all(std::vector<Child>& children, int& first_failure, std::string& why) {
  for (const Child& c : children)
    if (c.running) {
      ::kill(c.pid, SIGTERM);
      ::kill(c.pid, SIGCONT);  // a stopped rank (SIGSTOP, a hang the watchdogs caught) acts on it only once running
    }
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (reap(children, first_failure, why) > 0 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  for (Child& c : children)
    if (c.running) {
      ::kill(c.pid, SIGKILL);
      ::waitpid(c.pid, &c.status, 0);
      c.running = false;
    }
}

}  // namespace

std::vector<std::string> rank_child_args(int argc, const char* const* argv) {
  std::vector<std::string> out;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--gpus") {
      ++i;  // and its value
      continue;
    }
    if (a.rfind("--gpus=", 0) == 0) continue;
    out.push_back(a);
  }
  return out;
}

int supervise_ranks(const RankLaunch& launch, const std::string& program, const std::vector<std::string>& args,
                    const std::atomic<bool>* stop, const volatile int* stop_signal) {
  const int n = launch.gpus;
  const int port = launch.master_port > 0 ? launch.master_port : free_port();
  spdlog::info("data parallel: starting {} rank{} on this machine's GPUs 0..{} (rendezvous at {}:{})", n,
               n == 1 ? "" : "s", n - 1, launch.master_addr, port);
  std::vector<Child> children(static_cast<std::size_t>(n));
  int first_failure = -1;
  std::string why;
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> a = args;
    for (const std::string& extra :
         {std::string("--rank"), std::to_string(r), std::string("--world-size"), std::to_string(n),
          std::string("--local-rank"), std::to_string(r), std::string("--master-addr"), launch.master_addr,
          std::string("--master-port"), std::to_string(port), std::string("--rendezvous-timeout"),
          fmt::format("{}", launch.timeout_s)})
      a.push_back(extra);
    try {
      children[static_cast<std::size_t>(r)] = {start_rank(program, a), true, 0};
    } catch (const ConfigError&) {
      stop_all(children, first_failure, why);
      throw;
    }
  }
  while (reap(children, first_failure, why) > 0) {
    if (first_failure >= 0) {
      spdlog::error("data parallel: rank {} {}: stopping the other ranks", first_failure, why);
      stop_all(children, first_failure, why);
      break;
    }
    if (stop && stop->load()) {
      spdlog::warn("data parallel: interrupted: stopping every rank (no checkpoint is written on an interrupt; "
                   "run.checkpoint_every keeps periodic ones)");
      stop_all(children, first_failure, why);
      return 128 + (stop_signal ? *stop_signal : SIGINT);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (first_failure >= 0) {
    const int status = children[static_cast<std::size_t>(first_failure)].status;
    spdlog::error("data parallel: the run failed: rank {} {} (its own error is printed above)", first_failure,
                  describe_wait_status(status));
    return WIFEXITED(status) ? std::max(1, WEXITSTATUS(status)) : 128 + WTERMSIG(status);
  }
  spdlog::info("data parallel: all {} rank{} finished", n, n == 1 ? "" : "s");
  return 0;
}

}  // namespace sg::app
