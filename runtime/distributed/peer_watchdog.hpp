#pragma once
// Ends a data-parallel rank, with one clear line and no hang, when another
// rank dies or the collective library reports an error (issue 25).
//
// A rank blocked in a collective whose peer is gone waits forever: NCCL's
// kernels spin on data that never comes, inside a captured graph replay the
// host cannot interrupt. The watchdog thread watches the rendezvous's TCP
// connections (rendezvous.hpp: rank 0 keeps one per peer, every other rank
// its one to rank 0) and, every `check_every`, the collective's asynchronous
// error (ncclCommGetAsyncError). A dead process's kernel closes its
// connections, so its end is seen at once:
//   - a connection that closes (or fails) without a goodbye byte first, or an
//     asynchronous error, makes the rank print ONE line (`report`), close its
//     connections (rank 0 first tells every other peer which rank it lost),
//     abort the collective (ncclCommAbort, which releases NCCL kernels stuck
//     in a replay) and exit with `exit_status`, writing nothing more (no
//     checkpoint). If the abort itself hangs (it can, with a peer gone
//     mid-collective), the process exits after `abort_grace` anyway.
//   - a peer that sends nothing for `peer_timeout` (its process stopped,
//     SIGSTOP, or hung so badly that its watchdog thread cannot run) is lost
//     the same way. Every watchdog sends a one-byte heartbeat on each
//     connection every `heartbeat_every`, from this thread, so a rank busy
//     for a long time in a step, a start-up or an evaluation still beats.
//   - an orderly end, end(true), sends the goodbye first: the rank has run
//     every collective of the run, so no peer can be left waiting on it.
//     Only a rank whose training steps all completed says goodbye; one that
//     ends any other way (an error, a signal, end(false)) just closes, and
//     every peer still in its steps ends too.
// After end() (or when this object is destroyed) the rank watches nothing:
// what it does next (evaluate, write outputs) involves no collective.
//
// Ownership, so the thread can never use a collective that is being
// destroyed: the collective registers itself with watch() and keeps the
// returned Watch; dropping the Watch (first thing in the collective's
// destructor) waits for any check in progress and stops further ones. A
// decision to end the rank holds the same lock until the process exits, so
// the collective is not destroyed under it either.
//
// No GPU is involved: tests/runtime/test_rendezvous_watchdog.cpp runs it in
// real processes with a stand-in collective and SIGKILLs one of them.
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/distributed/rendezvous.hpp"

namespace sg::distributed {

// The collective library as the watchdog sees it (the NCCL communicator,
// runtime/cuda/nccl_communicator.hpp). Both calls come from the watchdog
// thread while the main thread may be inside a collective.
class WatchedCollective {
 public:
  virtual ~WatchedCollective() = default;
  virtual std::string collective_name() const = 0;  // "NCCL", for the message
  // The library's asynchronous error (a peer died, a network failure), or nothing.
  virtual std::optional<std::string> async_error() = 0;
  // Ends every collective in flight (ncclCommAbort); called at most once, just
  // before the process exits.
  virtual void abort() = 0;
};

struct WatchdogOptions {
  std::chrono::milliseconds check_every{200};  // how often async_error() is read (sockets wake the thread at once)
  // Exit after this even if abort() has not returned: ncclCommAbort can wait
  // on a dead peer's collective, and every rank must end within 2 s (issue 38).
  std::chrono::milliseconds abort_grace{1'000};
  std::chrono::milliseconds heartbeat_every{500};
  std::chrono::milliseconds peer_timeout{30'000};  // silence after which a peer counts as hung
  int exit_status = 1;
  // Prints the one line (default: to stderr); the app tags it with the rank.
  std::function<void(const std::string&)> report;
};

// What the watchdog found, as the one line it prints:
// "data parallel: rank 1 lost rank 0 (its connection closed without a goodbye): aborting NCCL and ending this rank".
std::string lost_rank_message(int rank, int lost, const std::string& why, const std::string& collective);
std::string collective_error_message(int rank, const std::string& collective, const std::string& error);

class PeerWatchdog {
 public:
  // Starts watching `links` (and, once one registers, a collective).
  explicit PeerWatchdog(PeerLinks links, WatchdogOptions options = {});
  ~PeerWatchdog();  // end(false)
  PeerWatchdog(const PeerWatchdog&) = delete;
  PeerWatchdog& operator=(const PeerWatchdog&) = delete;

  struct Shared;  // the lock, the registered collective and the ending flag, shared with Watch
  // A collective's registration; dropping it waits for a check in progress.
  class Watch {
   public:
    Watch() = default;
    explicit Watch(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}
    Watch(Watch&&) noexcept = default;
    Watch& operator=(Watch&& o) noexcept;
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;
    ~Watch() { release(); }
    void release();

   private:
    std::shared_ptr<Shared> shared_;
  };
  // Registers the collective whose async error is checked and which is
  // aborted when the rank ends; one at a time (throws std::logic_error).
  [[nodiscard]] Watch watch(WatchedCollective& collective);

  // Stops watching, joins the thread and closes the connections; with
  // `completed`, first sends every peer the goodbye (call it only once this
  // rank's last collective has completed on the device). Idempotent.
  void end(bool completed);

  int rank() const { return rank_; }

 private:
  struct Link {
    int rank = 0;
    Socket socket;
    bool said_goodbye = false;  // it has run its last collective: its close is no loss
    bool closed = false;        // no longer polled
    std::chrono::steady_clock::time_point last_heard;  // any byte, a heartbeat included
    std::string unread;         // a message's first bytes (a lost-rank notice is 5 bytes)
  };
  void run();
  void read_from(Link& link);
  // Sends the heartbeats that are due; loses a peer silent for peer_timeout.
  void beat_and_check_silence();
  // Ends the rank (prints `line`, tells the other peers `lost` is gone
  // because `why`, aborts the collective, exits) unless end() came first:
  // then it returns. `lock` holds shared_->mutex.
  void lose(std::unique_lock<std::mutex>& lock, int lost, const std::string& line, const std::string& why);

  int rank_ = 0;
  int world_size_ = 1;
  WatchdogOptions options_;
  std::shared_ptr<Shared> shared_;
  std::vector<Link> links_;  // the thread's while it runs; end()'s after it is joined
  Socket wake_read_, wake_write_;  // a byte on this pipe ends run()
  std::chrono::steady_clock::time_point next_beat_, last_turn_;
  bool ended_ = false;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace sg::distributed
