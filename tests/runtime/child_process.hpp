#pragma once
// Real processes for the tests of the data-parallel rendezvous and watchdog:
// a free loopback port, and a forked child whose output the parent reads
// through a pipe.
#include <doctest/doctest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <string>

namespace sg::test {

// A TCP port on the loopback interface that nothing listens on right now.
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

struct Child {
  pid_t pid = -1;
  int output = -1;  // the read end of the child's pipe
};

// Forks a child that runs `body` with the write end of a pipe and exits with
// what it returns (never returning into the test runner).
inline Child fork_child(const std::function<int(int write_fd)>& body) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    ::_exit(body(fds[1]));
  }
  ::close(fds[1]);
  return {pid, fds[0]};
}

// Everything the child wrote until its end closed, then its wait status.
inline std::string read_until_exit(const Child& child, int& status) {
  std::string out;
  char buf[4096];
  for (ssize_t k; (k = ::read(child.output, buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(k));
  ::close(child.output);
  ::waitpid(child.pid, &status, 0);
  return out;
}

}  // namespace sg::test
