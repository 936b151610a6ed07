// The peer watchdog of a data-parallel run (issue 25) between real processes
// on this host, no GPU: after the rendezvous every rank "hangs" (as a rank
// blocked in an NCCL collective does) while one is SIGKILLed, leaves without
// a goodbye or sees its collective report an error; every other rank must
// print one clear line, abort its collective (a stand-in here that says so)
// and exit non-zero within a few seconds. Ranks that end in order (goodbye
// first) print nothing and exit 0.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/distributed/peer_watchdog.hpp"
#include "tests/runtime/child_process.hpp"

using namespace sg::distributed;
using Clock = std::chrono::steady_clock;

namespace {

using sg::test::free_port;

// Stands in for the NCCL communicator: reports `error` once `error_after`
// has passed (never when empty) and says on stderr when it is aborted.
class StandInCollective final : public WatchedCollective {
 public:
  StandInCollective(std::string error, std::chrono::milliseconds error_after, bool abort_hangs)
      : error_(std::move(error)), error_at_(Clock::now() + error_after), abort_hangs_(abort_hangs) {}
  std::string collective_name() const override { return "stand-in"; }
  std::optional<std::string> async_error() override {
    if (error_.empty() || Clock::now() < error_at_) return std::nullopt;
    return error_;
  }
  void abort() override {
    static const char said[] = "stand-in collective aborted\n";
    (void)!::write(2, said, sizeof said - 1);
    // As ncclCommAbort can, waiting on a collective whose peer is gone.
    if (abort_hangs_) std::this_thread::sleep_for(std::chrono::seconds(20));
  }

 private:
  std::string error_;
  Clock::time_point error_at_;
  bool abort_hangs_;
};

// What one rank does after the rendezvous.
struct Behaviour {
  enum Kind { hang, sigkill, goodbye, leave_silently, sigstop } kind = hang;
  int after_ms = 0;              // when it dies, says goodbye or leaves
  int stay_ms = 0;               // goodbye: how long it lives on after it (watching nothing)
  std::string collective_error;  // the stand-in reports this at after_ms (hang only)
  bool abort_hangs = false;      // the stand-in's abort never returns
};

Behaviour make(Behaviour::Kind kind, int after_ms = 0, int stay_ms = 0, std::string error = {}) {
  Behaviour b;
  b.kind = kind;
  b.after_ms = after_ms;
  b.stay_ms = stay_ms;
  b.collective_error = std::move(error);
  return b;
}
Behaviour hangs() { return make(Behaviour::hang); }
Behaviour killed_after(int ms) { return make(Behaviour::sigkill, ms); }
Behaviour goodbye_after(int ms, int stay_ms = 0) { return make(Behaviour::goodbye, ms, stay_ms); }
Behaviour leaves_after(int ms) { return make(Behaviour::leave_silently, ms); }
Behaviour fails_after(int ms, std::string error) { return make(Behaviour::hang, ms, 0, std::move(error)); }
Behaviour stopped_after(int ms) { return make(Behaviour::sigstop, ms); }
Behaviour hangs_and_abort_hangs() {
  Behaviour b = hangs();
  b.abort_hangs = true;
  return b;
}

constexpr int kPeerTimeoutMs = 1500;  // the watchdog's silence limit in these worlds

struct RankResult {
  int status = 0;
  std::string stderr_text;
};

void run_rank(int rank, int world, int port, const Behaviour& b) {
  RendezvousOptions o;
  o.rank = rank;
  o.world_size = world;
  o.master_port = port;
  o.config_hash = 7;
  o.timeout = std::chrono::milliseconds(5000);
  auto joined = rendezvous_keeping_links(o, rank == 0 ? std::string("id") : std::string());
  WatchdogOptions w;
  w.check_every = std::chrono::milliseconds(20);
  w.heartbeat_every = std::chrono::milliseconds(100);
  w.peer_timeout = std::chrono::milliseconds(kPeerTimeoutMs);
  w.exit_status = 3;  // abort_grace: the default (1 s)
  PeerWatchdog watchdog(std::move(joined.links), w);
  StandInCollective collective(b.collective_error, std::chrono::milliseconds(b.after_ms), b.abort_hangs);
  auto watch = watchdog.watch(collective);
  const auto sleep_ms = [](int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); };
  switch (b.kind) {
    case Behaviour::hang:  // blocked "in a collective" far longer than the test allows
      sleep_ms(20'000);
      ::_exit(0);
    case Behaviour::sigkill:
      sleep_ms(b.after_ms);
      ::kill(::getpid(), SIGKILL);
      sleep_ms(20'000);
      ::_exit(0);
    case Behaviour::goodbye:
      sleep_ms(b.after_ms);
      watchdog.end(/*completed=*/true);
      sleep_ms(b.stay_ms);
      ::_exit(0);
    case Behaviour::leave_silently:
      sleep_ms(b.after_ms);
      return;  // the watchdog's destructor closes without a goodbye, as an error unwinding would
    case Behaviour::sigstop:  // every thread stops, the watchdog's too; its sockets stay open
      sleep_ms(b.after_ms);
      ::kill(::getpid(), SIGSTOP);
      sleep_ms(20'000);
      ::_exit(0);
  }
}

// One process per rank; their stderr and exit status, and the wall time until the last ended.
std::vector<RankResult> run_world(const std::vector<Behaviour>& behaviours, double& seconds) {
  const int world = static_cast<int>(behaviours.size());
  const int port = free_port();
  const auto start = Clock::now();
  std::vector<sg::test::Child> children;
  for (int r = 0; r < world; ++r)
    children.push_back(sg::test::fork_child([&](int fd) {
      ::dup2(fd, 2);  // the rank's stderr is the pipe
      ::close(fd);
      try {
        run_rank(r, world, port, behaviours[static_cast<std::size_t>(r)]);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 9;
      }
      return 0;
    }));
  std::vector<RankResult> results(children.size());
  // The stopped ranks never end by themselves: the others first, then those are killed.
  for (std::size_t r = 0; r < children.size(); ++r)
    if (behaviours[r].kind != Behaviour::sigstop)
      results[r].stderr_text = sg::test::read_until_exit(children[r], results[r].status);
  seconds = std::chrono::duration<double>(Clock::now() - start).count();
  for (std::size_t r = 0; r < children.size(); ++r)
    if (behaviours[r].kind == Behaviour::sigstop) {
      ::kill(children[r].pid, SIGKILL);
      results[r].stderr_text = sg::test::read_until_exit(children[r], results[r].status);
    }
  return results;
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

bool exited_with(const RankResult& r, int status) { return WIFEXITED(r.status) && WEXITSTATUS(r.status) == status; }

// One "data parallel:" line, that line, and the abort after it.
void check_ended(const RankResult& r, const std::string& line) {
  INFO("stderr: " << r.stderr_text);
  CHECK(exited_with(r, 3));
  CHECK(count(r.stderr_text, "data parallel:") == 1);
  CHECK(r.stderr_text.find(line) != std::string::npos);
  const auto said = r.stderr_text.find(line), aborted = r.stderr_text.find("stand-in collective aborted");
  CHECK(aborted != std::string::npos);
  CHECK(said < aborted);
}

}  // namespace

TEST_CASE("peer watchdog: a rank SIGKILLed after the rendezvous ends every other rank with one line") {
  double seconds = 0;
  const auto got = run_world({hangs(), hangs(), killed_after(300)}, seconds);
  CHECK(WIFSIGNALED(got[2].status));
  check_ended(got[0], "data parallel: rank 0 lost rank 2 (its connection closed without a goodbye): aborting "
                      "stand-in and ending this rank");
  // Rank 1 has no connection to rank 2: rank 0 tells it.
  check_ended(got[1], "data parallel: rank 1 lost rank 2 (its connection to rank 0 closed without a goodbye): "
                      "aborting stand-in and ending this rank");
  CHECK(seconds < 5.0);  // not the 20 s the "hanging" ranks would wait
}

TEST_CASE("peer watchdog: rank 0 SIGKILLed ends every peer") {
  double seconds = 0;
  const auto got =
      run_world({killed_after(300), hangs(), hangs(), hangs()}, seconds);
  CHECK(WIFSIGNALED(got[0].status));
  for (int r = 1; r < 4; ++r)
    check_ended(got[static_cast<std::size_t>(r)],
                "data parallel: rank " + std::to_string(r) +
                    " lost rank 0 (its connection closed without a goodbye): aborting stand-in and ending this rank");
  CHECK(seconds < 5.0);
}

TEST_CASE("peer watchdog: a rank that leaves without a goodbye (an error unwinding) counts as lost") {
  double seconds = 0;
  const auto got = run_world({hangs(), leaves_after(200), hangs()}, seconds);
  CHECK(exited_with(got[1], 0));
  CHECK(got[1].stderr_text.find("data parallel:") == std::string::npos);  // it was not watching when it left
  check_ended(got[0], "data parallel: rank 0 lost rank 1 (its connection closed without a goodbye)");
  check_ended(got[2], "data parallel: rank 2 lost rank 1 (its connection to rank 0 closed without a goodbye)");
  CHECK(seconds < 5.0);
}

TEST_CASE("peer watchdog: the collective's asynchronous error ends that rank, and through it every rank") {
  double seconds = 0;
  const auto got = run_world({hangs(), fails_after(300, "injected failure"), hangs()}, seconds);
  check_ended(got[1],
              "data parallel: rank 1: stand-in reported an error (injected failure): aborting stand-in and ending this rank");
  check_ended(got[0], "data parallel: rank 0 lost rank 1 (stand-in reported an error on it: injected failure)");
  check_ended(got[2], "data parallel: rank 2 lost rank 1 (stand-in reported an error on it: injected failure)");
  CHECK(seconds < 5.0);
  // On rank 0 itself: every peer hears it from rank 0 before its connection closes.
  const auto got0 = run_world({fails_after(300, "injected failure"), hangs()}, seconds);
  check_ended(got0[0], "data parallel: rank 0: stand-in reported an error (injected failure)");
  check_ended(got0[1], "data parallel: rank 1 lost rank 0 (stand-in reported an error on it: injected failure)");
}

TEST_CASE("peer watchdog: an abort that hangs (a peer gone mid-collective) still ends the rank within 2 s") {
  double seconds = 0;
  const auto got = run_world({hangs_and_abort_hangs(), hangs_and_abort_hangs(), killed_after(300)}, seconds);
  check_ended(got[0], "data parallel: rank 0 lost rank 2 (its connection closed without a goodbye)");
  check_ended(got[1], "data parallel: rank 1 lost rank 2 (its connection to rank 0 closed without a goodbye)");
  // The kill at 0.3 s, the abort_grace of 1 s, the rendezvous: not the 20 s the abort would take.
  CHECK(seconds < 2.5);
}

TEST_CASE("peer watchdog: a stopped rank (SIGSTOP) is lost after the silence limit and ends the others") {
  double seconds = 0;
  const auto got = run_world({hangs(), hangs(), stopped_after(300)}, seconds);
  const std::string hung = "(it sent nothing for ";
  check_ended(got[0], "data parallel: rank 0 lost rank 2 " + hung);
  CHECK(got[0].stderr_text.find(" s: stopped or hung): aborting stand-in and ending this rank") != std::string::npos);
  check_ended(got[1], "data parallel: rank 1 lost rank 2 (rank 0 heard nothing from it for ");
  // A stopped rank 0 (the hub): every peer times out by itself.
  double seconds0 = 0;
  const auto got0 = run_world({stopped_after(300), hangs(), hangs()}, seconds0);
  for (int r = 1; r < 3; ++r)
    check_ended(got0[static_cast<std::size_t>(r)], "data parallel: rank " + std::to_string(r) + " lost rank 0 " + hung);
  // Detected after the limit (counted from the last heartbeat heard, up to
  // 100 ms before the stop), not before it, and long before the 20 s the others would wait.
  for (const double s : {seconds, seconds0}) {
    CHECK(s > (300 + kPeerTimeoutMs - 200) / 1000.0);
    CHECK(s < (300 + kPeerTimeoutMs) / 1000.0 + 2.0);
  }
}

TEST_CASE("peer watchdog: ranks that end in order (goodbye first) print nothing and exit 0") {
  double seconds = 0;
  // Rank 2 ends first and exits while 0 and 1 still watch; then rank 0 (the
  // hub) ends while rank 1 still watches; rank 1 last.
  const auto got = run_world({goodbye_after(700, 200), goodbye_after(1200), goodbye_after(100)},
                             seconds);
  for (const auto& r : got) {
    INFO("stderr: " << r.stderr_text);
    CHECK(exited_with(r, 0));
    CHECK(r.stderr_text.empty());
  }
  CHECK(seconds < 5.0);
}

TEST_CASE("peer watchdog: a collective that registers and leaves while checks run is never used after it left") {
  // The ownership rule: the Watch is dropped first in the collective's
  // destructor, and dropping it waits for a check in progress.
  struct Counted final : WatchedCollective {
    std::atomic<bool>* alive;
    std::atomic<int>* misuse;
    Counted(std::atomic<bool>* a, std::atomic<int>* m) : alive(a), misuse(m) {}
    std::string collective_name() const override { return "counted"; }
    std::optional<std::string> async_error() override {
      if (!alive->load()) ++*misuse;
      std::this_thread::sleep_for(std::chrono::microseconds(50));  // widen the window a race would need
      if (!alive->load()) ++*misuse;
      return std::nullopt;
    }
    void abort() override { ++*misuse; }
  };
  WatchdogOptions w;
  w.check_every = std::chrono::milliseconds(0);  // check as often as possible
  PeerWatchdog watchdog(PeerLinks{}, w);
  std::atomic<int> misuse{0};
  for (int i = 0; i < 2000; ++i) {
    std::atomic<bool> alive{true};
    Counted c(&alive, &misuse);
    auto watch = watchdog.watch(c);
    if (i % 7 == 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
    watch.release();
    alive = false;  // from here on the thread must not touch c
  }
  CHECK(misuse.load() == 0);
  std::atomic<bool> alive{true};
  Counted c(&alive, &misuse);
  auto first = watchdog.watch(c);
  CHECK_THROWS_AS((void)watchdog.watch(c), std::logic_error);
}

TEST_CASE("peer watchdog: the lines say which rank lost which, why, and what it does") {
  CHECK(lost_rank_message(1, 0, "its connection closed without a goodbye", "NCCL") ==
        "data parallel: rank 1 lost rank 0 (its connection closed without a goodbye): aborting NCCL and ending this rank");
  CHECK(lost_rank_message(0, 3, "its connection closed without a goodbye", "") ==
        "data parallel: rank 0 lost rank 3 (its connection closed without a goodbye): ending this rank");
  CHECK(collective_error_message(2, "NCCL", "remote process exited or there was a network error") ==
        "data parallel: rank 2: NCCL reported an error (remote process exited or there was a network error): aborting "
        "NCCL and ending this rank");
}
