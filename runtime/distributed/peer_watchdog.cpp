#include "runtime/distributed/peer_watchdog.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>

#include <fmt/format.h>

namespace sg::distributed {

// What the lock guards: the registered collective, and whether the rank is
// ending on purpose (end()), after which the thread decides nothing.
struct PeerWatchdog::Shared {
  std::mutex mutex;
  WatchedCollective* collective = nullptr;
  bool ending = false;
};

namespace {

// The bytes on a kept connection after the rendezvous. Nothing else is sent.
constexpr char kGoodbye = 'G';  // this rank has run its last collective
constexpr char kHeartbeat = 'H';  // this rank's watchdog runs (so its process is not stopped)
constexpr char kLostRank = 'L';  // + i32 rank + u32 length + reason: that rank is gone, end too
constexpr std::uint32_t kMaxReason = 1024;

void send_quietly(int fd, const void* data, std::size_t n) {
  // The peer may be gone already: a failed send changes nothing.
  (void)::send(fd, data, n, MSG_NOSIGNAL | MSG_DONTWAIT);
}

void send_lost_rank(int fd, int lost, const std::string& why) {
  const std::uint32_t length = static_cast<std::uint32_t>(std::min<std::size_t>(why.size(), kMaxReason));
  const std::int32_t rank = lost;
  std::string message(1, kLostRank);
  message.append(reinterpret_cast<const char*>(&rank), sizeof rank);
  message.append(reinterpret_cast<const char*>(&length), sizeof length);
  message.append(why, 0, length);
  send_quietly(fd, message.data(), message.size());
}

// Reads and drops whatever is waiting, so that closing sends FIN, not RST.
void drain(int fd) {
  char buf[256];
  while (::recv(fd, buf, sizeof buf, MSG_DONTWAIT) > 0) {
  }
}

void print_to_stderr(const std::string& line) {
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
}

}  // namespace

std::string lost_rank_message(int rank, int lost, const std::string& why, const std::string& collective) {
  return fmt::format("data parallel: rank {} lost rank {} ({}): {}", rank, lost, why,
                     collective.empty() ? std::string("ending this rank")
                                        : fmt::format("aborting {} and ending this rank", collective));
}

std::string collective_error_message(int rank, const std::string& collective, const std::string& error) {
  return fmt::format("data parallel: rank {}: {} reported an error ({}): aborting {} and ending this rank", rank,
                     collective, error, collective);
}

PeerWatchdog::Watch& PeerWatchdog::Watch::operator=(Watch&& o) noexcept {
  if (this != &o) {
    release();
    shared_ = std::move(o.shared_);
  }
  return *this;
}

void PeerWatchdog::Watch::release() {
  if (!shared_) return;
  {
    const std::lock_guard lock(shared_->mutex);  // waits for a check in progress
    shared_->collective = nullptr;
  }
  shared_.reset();
}

PeerWatchdog::PeerWatchdog(PeerLinks links, WatchdogOptions options)
    : rank_(links.rank), world_size_(links.world_size), options_(std::move(options)), shared_(std::make_shared<Shared>()) {
  if (!options_.report) options_.report = print_to_stderr;
  const auto now = std::chrono::steady_clock::now();
  for (PeerLink& l : links.links) links_.push_back({l.rank, std::move(l.socket), false, false, now, {}});
  next_beat_ = last_turn_ = now;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0)
    throw std::runtime_error(fmt::format("data parallel: cannot start the peer watchdog: pipe2 failed ({})",
                                         std::strerror(errno)));
  wake_read_ = Socket(fds[0]);
  wake_write_ = Socket(fds[1]);
  thread_ = std::thread([this] { run(); });
}

PeerWatchdog::~PeerWatchdog() { end(false); }

PeerWatchdog::Watch PeerWatchdog::watch(WatchedCollective& collective) {
  const std::lock_guard lock(shared_->mutex);
  if (shared_->collective) throw std::logic_error("peer watchdog: a collective is registered already");
  shared_->collective = &collective;
  return Watch(shared_);
}

void PeerWatchdog::end(bool completed) {
  if (ended_) return;
  {
    const std::lock_guard lock(shared_->mutex);  // blocks for good if the thread is ending the rank
    shared_->ending = true;
  }
  const char wake = 1;
  (void)!::write(wake_write_.fd(), &wake, 1);
  if (thread_.joinable()) thread_.join();
  ended_ = true;
  for (Link& l : links_) {
    if (!l.closed && l.socket.fd() >= 0) {
      drain(l.socket.fd());
      if (completed) send_quietly(l.socket.fd(), &kGoodbye, 1);
    }
    l.socket.reset();
    l.closed = true;
  }
}

void PeerWatchdog::run() {
  for (;;) {
    std::vector<pollfd> fds{{wake_read_.fd(), POLLIN, 0}};
    std::vector<Link*> polled;
    for (Link& l : links_)
      if (!l.closed) {
        fds.push_back({l.socket.fd(), POLLIN, 0});
        polled.push_back(&l);
      }
    const auto wait = std::min(options_.check_every, options_.heartbeat_every);
    const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(wait.count()));
    if (ready > 0) {
      if (fds[0].revents) return;  // end()
      for (std::size_t i = 0; i < polled.size(); ++i)
        if (fds[i + 1].revents) read_from(*polled[i]);
    }
    beat_and_check_silence();
    std::unique_lock lock(shared_->mutex);
    if (shared_->ending) return;
    if (WatchedCollective* c = shared_->collective)
      if (const auto error = c->async_error()) {
        const std::string name = c->collective_name();
        lose(lock, rank_, collective_error_message(rank_, name, *error),
             fmt::format("{} reported an error on it: {}", name, *error));
        return;  // not reached: lose() ends the process (ending is false under this lock)
      }
  }
}

void PeerWatchdog::read_from(Link& link) {
  char buf[512];
  for (;;) {
    const ssize_t k = ::recv(link.socket.fd(), buf, sizeof buf, MSG_DONTWAIT);
    if (k > 0) {
      link.last_heard = std::chrono::steady_clock::now();
      link.unread.append(buf, static_cast<std::size_t>(k));
      while (!link.unread.empty()) {
        if (link.unread[0] == kGoodbye) {
          link.said_goodbye = true;
          link.unread.erase(0, 1);
          continue;
        }
        if (link.unread[0] == kHeartbeat) {
          link.unread.erase(0, 1);
          continue;
        }
        if (link.unread[0] == kLostRank) {
          const std::size_t head = 1 + sizeof(std::int32_t) + sizeof(std::uint32_t);
          if (link.unread.size() < head) break;
          std::int32_t lost = 0;
          std::uint32_t length = 0;
          std::memcpy(&lost, link.unread.data() + 1, sizeof lost);
          std::memcpy(&length, link.unread.data() + 1 + sizeof lost, sizeof length);
          if (link.unread.size() < head + length) break;
          const std::string why = link.unread.substr(head, length);
          link.unread.erase(0, head + length);
          std::unique_lock lock(shared_->mutex);
          const WatchedCollective* c = shared_->collective;
          lose(lock, lost, lost_rank_message(rank_, lost, why, c ? c->collective_name() : std::string()), why);
          return;  // end() came first
          continue;
        }
        link.unread.erase(0, 1);  // not ours: nothing else is ever sent on these connections
      }
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    // A peer whose process ends with our heartbeats unread in its socket
    // resets the connection instead of closing it: the same end.
    const bool ended = k == 0 || errno == ECONNRESET;
    const std::string failure =
        ended ? std::string("closed without a goodbye") : fmt::format("failed ({})", std::strerror(errno));
    link.closed = true;
    if (link.said_goodbye) return;  // its last collective ran: its end is no loss
    std::unique_lock lock(shared_->mutex);
    const WatchedCollective* c = shared_->collective;
    lose(lock, link.rank,
         lost_rank_message(rank_, link.rank, "its connection " + failure, c ? c->collective_name() : std::string()),
         fmt::format("its connection to rank {} {}", rank_, failure));
    return;
  }
}

void PeerWatchdog::beat_and_check_silence() {
  const auto now = std::chrono::steady_clock::now();
  // A turn that came far later than poll's wait means this process itself was
  // stopped (Ctrl-Z stops every rank at once): its peers' silence meanwhile
  // says nothing about them, so the silence is counted from now.
  if (now - last_turn_ > options_.peer_timeout / 2)
    for (Link& l : links_) l.last_heard = now;
  last_turn_ = now;
  if (now >= next_beat_) {
    for (Link& l : links_)
      if (!l.closed) send_quietly(l.socket.fd(), &kHeartbeat, 1);
    next_beat_ = now + options_.heartbeat_every;
  }
  for (Link& l : links_) {
    if (l.closed || l.said_goodbye || now - l.last_heard < options_.peer_timeout) continue;
    const double silent_s = std::chrono::duration<double>(now - l.last_heard).count();
    std::unique_lock lock(shared_->mutex);
    const WatchedCollective* c = shared_->collective;
    const std::string why = fmt::format("it sent nothing for {:.1f} s: stopped or hung", silent_s);
    lose(lock, l.rank, lost_rank_message(rank_, l.rank, why, c ? c->collective_name() : std::string()),
         fmt::format("rank {} heard nothing from it for {:.1f} s: stopped or hung", rank_, silent_s));
    return;  // end() came first
  }
}

void PeerWatchdog::lose(std::unique_lock<std::mutex>& lock, int lost, const std::string& line, const std::string& why) {
  if (shared_->ending) return;  // end() is stopping the thread: this rank is past its collectives
  options_.report(line);
  // Every other peer learns which rank is gone and why (rank 0 passes it on
  // to the rest), then the connections close, so every rank ends, not only this one.
  for (Link& l : links_)
    if (!l.closed && l.rank != lost) send_lost_rank(l.socket.fd(), lost, why);
  for (Link& l : links_)
    if (!l.closed) ::shutdown(l.socket.fd(), SHUT_RDWR);
  const int status = options_.exit_status;
  const auto grace = options_.abort_grace;
  std::thread([status, grace] {
    std::this_thread::sleep_for(grace);
    std::_Exit(status);  // the abort hung: end anyway
  }).detach();
  if (shared_->collective) shared_->collective->abort();
  (void)lock;  // held to the end: nothing drops or destroys the collective under the abort
  std::_Exit(status);
}

}  // namespace sg::distributed
