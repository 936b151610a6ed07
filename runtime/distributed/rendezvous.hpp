#pragma once
// How the processes of a data-parallel run find each other without MPI
// (issue 25): rank 0 listens on master_addr:master_port (TCP), every other
// rank connects and says who it is (rank, world size, a hash of its resolved
// config); rank 0 checks that they agree and hands every rank the same
// payload (the NCCL unique id). Any disagreement, or a rank that does not
// come within the timeout, ends the rendezvous on every rank that got that
// far with one RendezvousError line naming it. The values are the torchrun
// variables (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), which apps/ reads
// and passes here as typed options: the runtime reads no environment.
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/distributed/tcp_socket.hpp"

namespace sg::distributed {

struct RendezvousError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct RendezvousOptions {
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::uint64_t config_hash = 0;  // every rank must present the same
  std::chrono::milliseconds timeout{60'000};  // for the whole rendezvous, on every rank
};

// The rendezvous's TCP connections, kept open after it: rank 0 holds one per
// peer, every other rank its one to rank 0. The peer watchdog
// (peer_watchdog.hpp) watches them for the rest of the run, so a rank that
// dies (its kernel closes the connection) is noticed by the others.
struct PeerLink {
  int rank = 0;  // the rank at the other end
  Socket socket;
};
struct PeerLinks {
  int rank = 0;  // this process's
  int world_size = 1;
  std::vector<PeerLink> links;
};

struct RendezvousResult {
  std::string payload;
  PeerLinks links;
};

// Rank 0 passes the payload (at most 64 KiB) and gets it back; every other
// rank gets rank 0's. Returns once all world_size ranks have checked in; at
// world size 1, at once (and with no links). Throws RendezvousError on a bad
// option, a world-size or config mismatch, a duplicate rank, a timeout or a
// peer that went away.
RendezvousResult rendezvous_keeping_links(const RendezvousOptions& options, const std::string& payload);
// The same, closing the connections at once (nothing watches the peers).
std::string rendezvous(const RendezvousOptions& options, const std::string& payload);

// FNV-1a 64 of `text` (the resolved config every rank compares).
std::uint64_t config_hash(const std::string& text);

}  // namespace sg::distributed
