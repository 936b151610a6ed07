#pragma once
// A socket (or any file descriptor) closed on scope exit: the rendezvous's
// TCP connections (runtime/distributed/rendezvous.hpp), which the peer
// watchdog (peer_watchdog.hpp) keeps open for the rest of the run.
#include <unistd.h>

#include <utility>

namespace sg::distributed {

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Socket& operator=(Socket&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { reset(); }
  int fd() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

}  // namespace sg::distributed
