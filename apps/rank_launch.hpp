#pragma once
// How this process takes part in a data-parallel run (issue 25), as typed
// options: `stepgraph train --gpus N` (this process starts and supervises N
// ranks, apps/rank_supervisor.hpp), or one rank of a run started by the
// supervisor or by a standard launcher: torchrun-style variables (MASTER_ADDR,
// MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK), Slurm's `srun` (SLURM_PROCID,
// SLURM_NTASKS, SLURM_LOCALID, SLURM_JOB_NODELIST, SLURM_JOB_ID) or Open MPI's
// `mpirun` (OMPI_COMM_WORLD_*); the command-line options win. This file is the
// only place stepgraph reads those variables: everything after it sees the
// typed options.
#include <functional>
#include <string>

#include <CLI/CLI.hpp>

namespace sg::app {

struct RankLaunch {
  int gpus = 0;             // --gpus N: start and supervise N ranks on this machine (this process trains none)
  int rank = -1;            // --rank, RANK, OMPI_COMM_WORLD_RANK or SLURM_PROCID
  int world_size = 0;       // --world-size, WORLD_SIZE, OMPI_COMM_WORLD_SIZE or SLURM_NTASKS; 0: a single-process run
  int local_rank = -1;      // --local-rank, LOCAL_RANK or the launcher's: the GPU of this machine (default: the rank)
  std::string master_addr;  // --master-addr or MASTER_ADDR (default 127.0.0.1; Slurm: its first node): rank 0
  int master_port = 0;      // --master-port or MASTER_PORT (default 29500; Slurm: + SLURM_JOB_ID mod 1000)
  double timeout_s = 300;   // --rendezvous-timeout: for the rendezvous, NCCL setup and each collective enqueue
  double peer_timeout_s = 30;  // --peer-timeout: a rank silent this long (stopped, hung) ends every rank
  // Where rank and world size came from, for the logs: "command line",
  // "torchrun variables", "Slurm", "Open MPI", "--gpus"; empty: a single-process run.
  std::string launcher;
  bool data_parallel() const { return world_size > 0; }
};

void add_rank_options(CLI::App& cmd, RankLaunch& launch);

// `cli` with what the command line left unset taken from the environment
// (`getenv` reads it; tests pass their own), checked. Rank and world size come
// from one source, the first of: the command line, RANK/WORLD_SIZE, Open MPI's
// OMPI_COMM_WORLD_RANK/SIZE, Slurm's SLURM_PROCID/SLURM_NTASKS (only when
// SLURM_NTASKS > 1); --local-rank/LOCAL_RANK and --master-addr/MASTER_ADDR,
// --master-port/MASTER_PORT win over that launcher's own values. Throws
// ConfigError naming the option or variable: a non-integer or out-of-range
// value, RANK without WORLD_SIZE or the reverse, --gpus with a rank, a bad
// SLURM_JOB_NODELIST, Open MPI over several machines without a master address.
RankLaunch resolve_rank_launch(RankLaunch cli, const std::function<const char*(const char*)>& getenv);
RankLaunch resolve_rank_launch(RankLaunch cli);  // from this process's environment

// The first host of a Slurm host list (SLURM_JOB_NODELIST, compressed syntax):
// "gpu-node[03-05,07],login1" -> "gpu-node03", "n1,n2" -> "n1", "a[001-004]" ->
// "a001" (leading zeros kept). Throws ConfigError naming SLURM_JOB_NODELIST and
// the text when it is empty or its brackets do not pair up.
std::string first_slurm_host(const std::string& nodelist);

}  // namespace sg::app
