#include "runtime/distributed/rendezvous.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace sg::distributed {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::uint32_t kMagic = 0x53475256;  // "SGRV"
constexpr std::uint32_t kVersion = 1;
constexpr std::uint32_t kMaxPayload = 64 * 1024;

// What a rank tells rank 0.
struct Hello {
  std::uint32_t magic = kMagic;
  std::uint32_t version = kVersion;
  std::int32_t rank = 0;
  std::int32_t world_size = 0;
  std::uint64_t config_hash = 0;
};

std::string where(const RendezvousOptions& o) { return fmt::format("{}:{}", o.master_addr, o.master_port); }

std::string seconds(std::chrono::milliseconds ms) { return fmt::format("{:g} s", double(ms.count()) / 1000.0); }

int millis_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1'000'000'000));
}

// Waits until `fd` is ready for `events`; false on timeout.
bool wait_for(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, millis_left(deadline));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) throw RendezvousError(fmt::format("rendezvous: poll failed: {}", std::strerror(errno)));
  }
}

// Sends all of `bytes`; throws naming `peer` when it cannot.
void send_all(int fd, const void* data, std::size_t n, Clock::time_point deadline, const std::string& peer) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    if (!wait_for(fd, POLLOUT, deadline)) throw RendezvousError(fmt::format("rendezvous: timed out sending to {}", peer));
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw RendezvousError(fmt::format("rendezvous: lost the connection to {} ({})", peer, std::strerror(errno)));
    }
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

// Receives exactly n bytes; false on timeout; throws when the peer closes.
bool recv_all(int fd, void* data, std::size_t n, Clock::time_point deadline, const std::string& peer) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    if (!wait_for(fd, POLLIN, deadline)) return false;
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k == 0) throw RendezvousError(fmt::format("rendezvous: {} closed the connection (did it exit?)", peer));
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw RendezvousError(fmt::format("rendezvous: lost the connection to {} ({})", peer, std::strerror(errno)));
    }
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

void send_u32(int fd, std::uint32_t v, Clock::time_point deadline, const std::string& peer) {
  send_all(fd, &v, sizeof v, deadline, peer);
}

// Rank 0's answer: status 0 and the payload, or status 1 and why.
void send_reply(int fd, bool ok, const std::string& text, Clock::time_point deadline, const std::string& peer) {
  send_u32(fd, kMagic, deadline, peer);
  send_u32(fd, ok ? 0u : 1u, deadline, peer);
  send_u32(fd, static_cast<std::uint32_t>(text.size()), deadline, peer);
  send_all(fd, text.data(), text.size(), deadline, peer);
}

addrinfo* resolve(const RendezvousOptions& o, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const auto port = std::to_string(o.master_port);
  if (const int rc = ::getaddrinfo(o.master_addr.c_str(), port.c_str(), &hints, &found); rc != 0)
    throw RendezvousError(fmt::format("rendezvous: cannot resolve the master address {} ({})", where(o), ::gai_strerror(rc)));
  return found;
}

// TCP keepalive on a kept connection: a peer whose machine vanishes (no FIN,
// no RST) shows as a failed connection after about 25 s instead of never.
// Best effort: without it a vanished machine is still seen by NCCL's own
// error (peer_watchdog.hpp), and a dead process by its closed socket.
void keep_alive(int fd) {
  const int on = 1, idle_s = 10, interval_s = 5, probes = 3;
  const bool all = ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on) == 0 &&
                   ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof idle_s) == 0 &&
                   ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof interval_s) == 0 &&
                   ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes) == 0;
  (void)all;
}

Socket listen_on(const RendezvousOptions& o) {
  addrinfo* found = resolve(o, true);
  std::string last_error = "no address";
  Socket s;
  for (addrinfo* a = found; a; a = a->ai_next) {
    Socket candidate(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (candidate.fd() < 0) continue;
    const int one = 1;
    ::setsockopt(candidate.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(candidate.fd(), a->ai_addr, a->ai_addrlen) == 0 && ::listen(candidate.fd(), 128) == 0) {
      s = std::move(candidate);
      break;
    }
    last_error = std::strerror(errno);
  }
  ::freeaddrinfo(found);
  if (s.fd() < 0)
    throw RendezvousError(fmt::format("rendezvous: rank 0 cannot listen on {} ({}); pick another --master-port",
                                      where(o), last_error));
  return s;
}

// Connects to rank 0, retrying until the deadline (it may not listen yet).
Socket connect_to(const RendezvousOptions& o, Clock::time_point deadline) {
  std::string last_error;
  while (Clock::now() < deadline) {
    addrinfo* found = resolve(o, false);
    for (addrinfo* a = found; a; a = a->ai_next) {
      Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
      if (s.fd() < 0) continue;
      if (::connect(s.fd(), a->ai_addr, a->ai_addrlen) == 0) {
        ::freeaddrinfo(found);
        const int one = 1;
        ::setsockopt(s.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        return s;
      }
      last_error = std::strerror(errno);
    }
    ::freeaddrinfo(found);
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(100, millis_left(deadline))));
  }
  throw RendezvousError(fmt::format("rendezvous: rank {} could not reach rank 0 at {} within {} ({}); is rank 0 running?",
                                    o.rank, where(o), seconds(o.timeout), last_error.empty() ? "timed out" : last_error));
}

RendezvousResult run_rank0(const RendezvousOptions& o, const std::string& payload, Clock::time_point deadline) {
  Socket listener = listen_on(o);
  std::vector<Socket> peers(static_cast<std::size_t>(o.world_size));
  int joined = 1;
  // Ends the rendezvous for every rank connected so far, then throws `why` here.
  auto abort_all = [&](const std::string& why) {
    const auto soon = Clock::now() + std::chrono::seconds(2);
    for (std::size_t r = 1; r < peers.size(); ++r)
      if (peers[r].fd() >= 0) {
        try {
          send_reply(peers[r].fd(), false, why, soon, fmt::format("rank {}", r));
        } catch (const RendezvousError&) {  // that rank is gone already: nothing more to tell it
        }
      }
    throw RendezvousError(why);
  };
  while (joined < o.world_size) {
    if (!wait_for(listener.fd(), POLLIN, deadline)) {
      std::vector<int> missing;
      for (int r = 1; r < o.world_size; ++r)
        if (peers[static_cast<std::size_t>(r)].fd() < 0) missing.push_back(r);
      abort_all(fmt::format("rendezvous: only {} of {} ranks reached rank 0 at {} within {} (missing rank{} {})", joined,
                            o.world_size, where(o), seconds(o.timeout), missing.size() == 1 ? "" : "s",
                            fmt::join(missing, ", ")));
    }
    Socket peer(::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC));
    if (peer.fd() < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
      abort_all(fmt::format("rendezvous: rank 0 cannot accept on {} ({})", where(o), std::strerror(errno)));
    }
    Hello h;
    bool complete = false;
    try {
      complete = recv_all(peer.fd(), &h, sizeof h, std::min(deadline, Clock::now() + std::chrono::seconds(10)),
                          "a connecting process");
    } catch (const RendezvousError&) {
      continue;  // it went away before saying who it is: not one of ours
    }
    if (!complete || h.magic != kMagic || h.version != kVersion) continue;  // a stray connection, not a stepgraph rank
    std::string why;
    if (h.world_size != o.world_size)
      why = fmt::format("rendezvous: rank {} was started with world size {} but rank 0 with {}; start every rank with "
                        "the same --gpus / WORLD_SIZE",
                        h.rank, h.world_size, o.world_size);
    else if (h.rank < 1 || h.rank >= o.world_size)
      why = fmt::format("rendezvous: a process says it is rank {}, outside 1..{} of world size {}", h.rank,
                        o.world_size - 1, o.world_size);
    else if (peers[static_cast<std::size_t>(h.rank)].fd() >= 0)
      why = fmt::format("rendezvous: two processes say they are rank {}", h.rank);
    else if (h.config_hash != o.config_hash)
      why = fmt::format("rendezvous: rank {}'s resolved config differs from rank 0's (hash {:016x} vs {:016x}); start "
                        "every rank with the same --config and --set options",
                        h.rank, h.config_hash, o.config_hash);
    if (!why.empty()) {
      try {
        send_reply(peer.fd(), false, why, Clock::now() + std::chrono::seconds(2), fmt::format("rank {}", h.rank));
      } catch (const RendezvousError&) {
      }
      abort_all(why);
    }
    peers[static_cast<std::size_t>(h.rank)] = std::move(peer);
    ++joined;
  }
  RendezvousResult result{payload, {o.rank, o.world_size, {}}};
  for (int r = 1; r < o.world_size; ++r) {
    Socket& s = peers[static_cast<std::size_t>(r)];
    send_reply(s.fd(), true, payload, deadline, fmt::format("rank {}", r));
    keep_alive(s.fd());
    result.links.links.push_back({r, std::move(s)});
  }
  return result;
}

RendezvousResult run_peer(const RendezvousOptions& o, Clock::time_point deadline) {
  Socket s = connect_to(o, deadline);
  const Hello h{kMagic, kVersion, o.rank, o.world_size, o.config_hash};
  const std::string rank0 = fmt::format("rank 0 at {}", where(o));
  send_all(s.fd(), &h, sizeof h, deadline, rank0);
  std::uint32_t head[3] = {0, 0, 0};
  if (!recv_all(s.fd(), head, sizeof head, deadline, rank0))
    throw RendezvousError(fmt::format("rendezvous: rank {} reached rank 0 at {} but not every rank came within {}",
                                      o.rank, where(o), seconds(o.timeout)));
  if (head[0] != kMagic || head[2] > kMaxPayload)
    throw RendezvousError(fmt::format("rendezvous: {} is not a stepgraph rank 0 (bad reply)", where(o)));
  std::string text(head[2], '\0');
  if (!recv_all(s.fd(), text.data(), text.size(), deadline, rank0))
    throw RendezvousError(fmt::format("rendezvous: rank {} timed out reading rank 0's reply", o.rank));
  if (head[1] != 0) throw RendezvousError(text);  // rank 0's reason, one line
  keep_alive(s.fd());
  RendezvousResult result{std::move(text), {o.rank, o.world_size, {}}};
  result.links.links.push_back({0, std::move(s)});
  return result;
}

}  // namespace

std::uint64_t config_hash(const std::string& text) {
  std::uint64_t h = 1469598103934665603ull;
  for (const unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

RendezvousResult rendezvous_keeping_links(const RendezvousOptions& o, const std::string& payload) {
  if (o.world_size < 1) throw RendezvousError(fmt::format("rendezvous: world size {} must be >= 1", o.world_size));
  if (o.rank < 0 || o.rank >= o.world_size)
    throw RendezvousError(fmt::format("rendezvous: rank {} is not in 0..{} (world size {})", o.rank, o.world_size - 1,
                                      o.world_size));
  if (o.master_port < 1 || o.master_port > 65535)
    throw RendezvousError(fmt::format("rendezvous: master port {} is not in 1..65535", o.master_port));
  if (payload.size() > kMaxPayload) throw RendezvousError("rendezvous: payload larger than 64 KiB");
  if (o.world_size == 1) return {payload, {0, 1, {}}};
  const auto deadline = Clock::now() + o.timeout;
  return o.rank == 0 ? run_rank0(o, payload, deadline) : run_peer(o, deadline);
}

std::string rendezvous(const RendezvousOptions& o, const std::string& payload) {
  return rendezvous_keeping_links(o, payload).payload;
}

}  // namespace sg::distributed
