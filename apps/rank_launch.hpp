#pragma once
// How this process takes part in a data-parallel run (issue 25), as typed
// options: `stepgraph train --gpus N` (this process starts and supervises N
// ranks, apps/rank_supervisor.hpp), or one rank of a run started by the
// supervisor or by a standard launcher (torchrun-style variables MASTER_ADDR,
// MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK; the command-line options win).
// This file is the only place stepgraph reads those variables: everything
// after it sees the typed options.
#include <functional>
#include <string>

#include <CLI/CLI.hpp>

namespace sg::app {

struct RankLaunch {
  int gpus = 0;             // --gpus N: start and supervise N ranks on this machine (this process trains none)
  int rank = -1;            // --rank or RANK
  int world_size = 0;       // --world-size or WORLD_SIZE; 0: a single-process run
  int local_rank = -1;      // --local-rank or LOCAL_RANK: the GPU of this machine (default: the rank)
  std::string master_addr;  // --master-addr or MASTER_ADDR (default 127.0.0.1): where rank 0 listens
  int master_port = 0;      // --master-port or MASTER_PORT (default 29500)
  double timeout_s = 300;   // --rendezvous-timeout: for the rendezvous, NCCL setup and each collective enqueue
  bool data_parallel() const { return world_size > 0; }
};

void add_rank_options(CLI::App& cmd, RankLaunch& launch);

// `cli` with what the command line left unset taken from the torchrun
// variables (`getenv` reads them; tests pass their own), checked. Throws
// ConfigError naming the option or variable: a non-integer or out-of-range
// value, RANK without WORLD_SIZE or the reverse, --gpus with a rank.
RankLaunch resolve_rank_launch(RankLaunch cli, const std::function<const char*(const char*)>& getenv);
RankLaunch resolve_rank_launch(RankLaunch cli);  // from this process's environment

}  // namespace sg::app
