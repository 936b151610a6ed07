// The data-parallel rendezvous (issue 25) between real processes on this
// host, no GPU: every rank gets rank 0's payload; a rank that never comes, a
// world-size or config mismatch and a missing rank 0 end every process that
// got that far with one clear line, within the timeout.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "runtime/distributed/rendezvous.hpp"
#include "tests/runtime/child_process.hpp"

using namespace sg::distributed;

namespace {

using sg::test::free_port;

RendezvousOptions options(int rank, int world, int port, std::uint64_t hash = 42, int timeout_ms = 5000) {
  RendezvousOptions o;
  o.rank = rank;
  o.world_size = world;
  o.master_port = port;
  o.config_hash = hash;
  o.timeout = std::chrono::milliseconds(timeout_ms);
  return o;
}

// Runs each function in its own process; returns what each returned, or
// "error: <what()>" when it threw.
std::vector<std::string> in_processes(const std::vector<std::function<std::string()>>& ranks) {
  std::vector<sg::test::Child> children;
  for (const auto& f : ranks)
    children.push_back(sg::test::fork_child([&](int fd) {
      std::string out;
      try {
        out = f();
      } catch (const std::exception& e) {
        out = std::string("error: ") + e.what();
      }
      std::size_t done = 0;
      while (done < out.size()) {
        const ssize_t k = ::write(fd, out.data() + done, out.size() - done);
        if (k <= 0) break;
        done += static_cast<std::size_t>(k);
      }
      return 0;
    }));
  std::vector<std::string> results;
  for (const sg::test::Child& child : children) {
    int status = 0;
    results.push_back(sg::test::read_until_exit(child, status));
    CHECK(WIFEXITED(status));
  }
  return results;
}

double seconds_of(const std::function<void()>& f) {
  const auto t = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

TEST_CASE("rendezvous: four processes get rank 0's payload, whatever order they start in") {
  const int port = free_port();
  const std::string id(128, '\0');  // an NCCL id is 128 opaque bytes, zeros included
  std::string payload = id;
  for (std::size_t i = 0; i < payload.size(); i += 3) payload[i] = static_cast<char>(i);
  std::vector<std::function<std::string()>> ranks;
  for (int r = 3; r >= 0; --r)  // the peers first: they retry until rank 0 listens
    ranks.push_back([=] {
      if (r > 0) ::usleep(static_cast<useconds_t>(r * 20'000));
      return rendezvous(options(r, 4, port), r == 0 ? payload : std::string());
    });
  for (const auto& got : in_processes(ranks)) CHECK(got == payload);
}

TEST_CASE("rendezvous: world size 1 needs no peer and no port") {
  CHECK(rendezvous(options(0, 1, 1), "id") == "id");
}

TEST_CASE("rendezvous: a rank that never comes ends rank 0 at the timeout, naming it") {
  const int port = free_port();
  std::string what;
  const double s = seconds_of([&] {
    try {
      rendezvous(options(0, 3, port, 42, 800), "id");
    } catch (const RendezvousError& e) {
      what = e.what();
    }
  });
  CHECK(what.find("missing ranks 1, 2") != std::string::npos);
  CHECK(what.find("only 1 of 3 ranks") != std::string::npos);
  CHECK(s < 5.0);
  // One of two peers comes: rank 0 and that peer both end, naming the missing one.
  const auto got = in_processes({[=] { return rendezvous(options(0, 3, port, 42, 1000), "id"); },
                                 [=] { return rendezvous(options(2, 3, port, 42, 3000), ""); }});
  CHECK(got[0].find("error: rendezvous: only 2 of 3 ranks") != std::string::npos);
  CHECK(got[0].find("missing rank 1") != std::string::npos);
  CHECK(got[1] == got[0]);  // the peer hears rank 0's reason, not its own timeout
}

TEST_CASE("rendezvous: a missing rank 0 ends a peer at the timeout") {
  const int port = free_port();
  std::string what;
  const double s = seconds_of([&] {
    try {
      rendezvous(options(1, 2, port, 42, 600), "");
    } catch (const RendezvousError& e) {
      what = e.what();
    }
  });
  CHECK(what.find("rank 1 could not reach rank 0 at 127.0.0.1:" + std::to_string(port)) != std::string::npos);
  CHECK(s < 5.0);
}

TEST_CASE("rendezvous: a world-size mismatch ends both ranks with the same line") {
  const int port = free_port();
  const auto got = in_processes({[=] { return rendezvous(options(0, 2, port), "id"); },
                                 [=] { return rendezvous(options(1, 3, port), ""); }});
  CHECK(got[0].find("error: rendezvous: rank 1 was started with world size 3 but rank 0 with 2") != std::string::npos);
  CHECK(got[1] == got[0]);
}

TEST_CASE("rendezvous: a config mismatch, a duplicate rank and a rank outside the world are refused") {
  {
    const int port = free_port();
    const auto got = in_processes({[=] { return rendezvous(options(0, 2, port, config_hash("a: 1\n")), "id"); },
                                   [=] { return rendezvous(options(1, 2, port, config_hash("a: 2\n")), ""); }});
    CHECK(got[0].find("rank 1's resolved config differs from rank 0's") != std::string::npos);
    CHECK(got[1] == got[0]);
  }
  {
    const int port = free_port();
    const auto got = in_processes({[=] { return rendezvous(options(0, 3, port), "id"); },
                                   [=] { return rendezvous(options(1, 3, port), ""); },
                                   [=] {
                                     ::usleep(200'000);  // after the first rank 1
                                     return rendezvous(options(1, 3, port), "");
                                   }});
    CHECK(got[0].find("two processes say they are rank 1") != std::string::npos);
    CHECK(got[1] == got[0]);
    CHECK(got[2] == got[0]);
  }
  CHECK_THROWS_WITH_AS(rendezvous(options(2, 2, 1), ""), doctest::Contains("rank 2 is not in 0..1"), RendezvousError);
  CHECK_THROWS_WITH_AS(rendezvous(options(0, 2, 70000), ""), doctest::Contains("master port 70000"), RendezvousError);
}

TEST_CASE("rendezvous: the config hash tells resolved configs apart") {
  CHECK(config_hash("model:\n  layers: [784, 128, 10]\n") == config_hash("model:\n  layers: [784, 128, 10]\n"));
  CHECK(config_hash("model:\n  layers: [784, 128, 10]\n") != config_hash("model:\n  layers: [784, 129, 10]\n"));
}
