#include "apps/rank_launch.hpp"

#include <cerrno>
#include <cstdlib>

#include <fmt/format.h>

#include "apps/config/train_config.hpp"

namespace sg::app {
namespace {

using Getenv = std::function<const char*(const char*)>;

// The integer in `text`, or a ConfigError naming `what`.
int parse_int(const char* text, const std::string& what) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || errno != 0 || v < -1'000'000 || v > 1'000'000)
    throw ConfigError(fmt::format("{}='{}' is not an integer", what, text));
  return static_cast<int>(v);
}

// A set, non-empty variable, else nullptr (an empty variable counts as unset).
const char* var(const Getenv& getenv, const char* name) {
  const char* v = getenv(name);
  return v && *v ? v : nullptr;
}

// The integer in variable `name`, `fallback` when it is unset.
int int_var(const Getenv& getenv, const char* name, int fallback) {
  const char* v = var(getenv, name);
  return v ? parse_int(v, fmt::format("environment variable {}", name)) : fallback;
}

enum class Kind { command_line, torchrun, open_mpi, slurm };

// The source of rank and world size, and what the errors name.
struct Launcher {
  Kind kind = Kind::command_line;
  const char* rank_names = "--rank or RANK";
  const char* size_names = "--world-size or WORLD_SIZE";
  const char* local_rank_var = nullptr;  // the launcher's own local rank, below LOCAL_RANK
};

// Fills l.rank, l.world_size and l.launcher from the first source present.
// Open MPI comes before Slurm: mpirun run inside a Slurm allocation (its
// batch script, or daemons it starts with srun) hands its ranks the
// allocation's SLURM_PROCID and SLURM_NTASKS unchanged, while the
// OMPI_COMM_WORLD_* variables are set by mpirun for this very process.
Launcher pick_launcher(RankLaunch& l, const Getenv& getenv) {
  if (l.rank >= 0 || l.world_size > 0) {  // no variable mixes into the command line's rank and world size
    l.launcher = "command line";
    return {};
  }
  if (var(getenv, "RANK") || var(getenv, "WORLD_SIZE")) {  // all or none: one without the other is an error below
    l.rank = int_var(getenv, "RANK", -1);
    l.world_size = int_var(getenv, "WORLD_SIZE", 0);
    l.launcher = "torchrun variables";
    return {Kind::torchrun};
  }
  if (var(getenv, "OMPI_COMM_WORLD_RANK") && var(getenv, "OMPI_COMM_WORLD_SIZE")) {
    // mpirun -np 1 is a world of one: the user asked for mpirun, so it runs as one rank.
    l.rank = int_var(getenv, "OMPI_COMM_WORLD_RANK", -1);
    l.world_size = int_var(getenv, "OMPI_COMM_WORLD_SIZE", 0);
    l.launcher = "Open MPI";
    return {Kind::open_mpi, "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK"};
  }
  // Slurm sets SLURM_PROCID in a batch script and in a one-task job too: only
  // an srun of several tasks makes a data-parallel run, so a plain
  // `stepgraph train` in an allocation stays a single-process run.
  if (var(getenv, "SLURM_PROCID")) {
    const int tasks = int_var(getenv, "SLURM_NTASKS", 0);
    if (tasks > 1) {
      l.rank = int_var(getenv, "SLURM_PROCID", -1);
      l.world_size = tasks;
      l.launcher = "Slurm";
      return {Kind::slurm, "SLURM_PROCID/SLURM_NTASKS", "SLURM_NTASKS", "SLURM_LOCALID"};
    }
  }
  return {};
}

// Rank 0's port for a Slurm job when neither --master-port nor MASTER_PORT is
// given: 29500 + (SLURM_JOB_ID mod 1000), so two jobs that share a node rarely
// pick the same port; 29500 without an integer job id.
int slurm_port(const char* job_id) {
  if (!job_id) return 29500;
  int mod = 0;
  for (const char* c = job_id; *c; ++c) {  // digit by digit: a job id may not fit an int
    if (*c < '0' || *c > '9') return 29500;
    mod = (mod * 10 + (*c - '0')) % 1000;
  }
  return 29500 + mod;
}

// Rank 0's address when neither --master-addr nor MASTER_ADDR is given.
std::string default_master_addr(Kind kind, int world_size, const Getenv& getenv) {
  if (kind == Kind::slurm) {
    // With srun's default distribution over the whole allocation, task 0 runs
    // on the job's first node; a step on part of it needs MASTER_ADDR.
    const char* nodes = getenv("SLURM_JOB_NODELIST");
    if (!nodes)
      throw ConfigError(fmt::format("Slurm started {} tasks but SLURM_JOB_NODELIST is not set: give rank 0's address "
                                    "with --master-addr or MASTER_ADDR",
                                    world_size));
    return first_slurm_host(nodes);
  }
  if (kind == Kind::open_mpi) {  // mpirun says how many ranks share this machine, not where rank 0 is
    const int local = int_var(getenv, "OMPI_COMM_WORLD_LOCAL_SIZE", -1);
    if (local < 0)
      throw ConfigError(fmt::format("Open MPI started {} ranks without OMPI_COMM_WORLD_LOCAL_SIZE: give rank 0's "
                                    "address with --master-addr or MASTER_ADDR (mpirun -x MASTER_ADDR=...)",
                                    world_size));
    if (local != world_size)
      throw ConfigError(fmt::format("Open MPI started {} ranks on several machines (OMPI_COMM_WORLD_LOCAL_SIZE {} < "
                                    "OMPI_COMM_WORLD_SIZE {}): give rank 0's address with --master-addr or MASTER_ADDR "
                                    "(mpirun -x MASTER_ADDR=...)",
                                    world_size, local, world_size));
  }
  return "127.0.0.1";
}

void check_timeouts(const RankLaunch& l) {
  if (!(l.timeout_s > 0)) throw ConfigError(fmt::format("--rendezvous-timeout {} must be > 0", l.timeout_s));
  // Heartbeats go every 0.5 s: a limit near that would lose ranks that are merely slow to be scheduled.
  if (!(l.peer_timeout_s >= 2))
    throw ConfigError(fmt::format("--peer-timeout {} must be >= 2 (seconds; heartbeats go every 0.5 s)", l.peer_timeout_s));
}

}  // namespace

std::string first_slurm_host(const std::string& list) {
  const auto bad = [&list](const char* why) {
    return ConfigError(
        fmt::format("environment variable SLURM_JOB_NODELIST='{}' is not a Slurm host list: {}", list, why));
  };
  if (list.empty()) throw bad("it is empty");
  // Brackets must pair up, unnested, over the whole list: a list cut short is
  // not trusted for its first host either.
  int depth = 0;
  for (const char c : list) {
    if (c == '[' && depth++ > 0) throw bad("'[' inside brackets");
    if (c == ']' && --depth < 0) throw bad("']' without '['");
  }
  if (depth != 0) throw bad("'[' without ']'");
  // The first comma-separated entry outside brackets, each bracket group
  // ("[03-05,07]") replaced by its first number as written: leading zeros are
  // part of the host name.
  std::string host;
  for (std::size_t i = 0; i < list.size() && list[i] != ','; ++i) {
    if (list[i] != '[') {
      host += list[i];
      continue;
    }
    const std::size_t close = list.find(']', i);
    const std::string first = list.substr(i + 1, list.find_first_of(",-]", i + 1) - i - 1);
    if (first.empty() || first.find_first_not_of("0123456789") != std::string::npos)
      throw bad("a bracket that does not start with a number");
    host += first;
    i = close;
  }
  if (host.empty()) throw bad("its first host is empty");
  return host;
}

void add_rank_options(CLI::App& cmd, RankLaunch& l) {
  cmd.add_option("--gpus", l.gpus, "data parallel: start N ranks on this machine's GPUs and supervise them (NCCL)");
  cmd.add_option("--rank", l.rank,
                 "data parallel: this process's rank (else RANK, OMPI_COMM_WORLD_RANK or SLURM_PROCID)");
  cmd.add_option("--world-size", l.world_size,
                 "data parallel: number of ranks (else WORLD_SIZE, OMPI_COMM_WORLD_SIZE or SLURM_NTASKS)");
  cmd.add_option("--local-rank", l.local_rank,
                 "data parallel: this rank's GPU on its machine (else LOCAL_RANK, else the launcher's, else the rank)");
  cmd.add_option("--master-addr", l.master_addr,
                 "data parallel: where rank 0 listens (else MASTER_ADDR, else Slurm's first node or 127.0.0.1)");
  cmd.add_option("--master-port", l.master_port,
                 "data parallel: rank 0's TCP port (else MASTER_PORT, else 29500; Slurm: + job id mod 1000)");
  cmd.add_option("--rendezvous-timeout", l.timeout_s, "data parallel: seconds to wait for every rank")
      ->capture_default_str();
  cmd.add_option("--peer-timeout", l.peer_timeout_s,
                 "data parallel: seconds a rank may send nothing (stopped, hung) before every rank ends")
      ->capture_default_str();
}

RankLaunch resolve_rank_launch(RankLaunch l, const Getenv& getenv) {
  if (l.gpus < 0) throw ConfigError(fmt::format("--gpus {} must be >= 1", l.gpus));
  if (l.gpus > 0) {  // the supervisor numbers its ranks itself: no launcher's variables apply
    if (l.rank >= 0 || l.world_size > 0)
      throw ConfigError("--gpus starts and numbers the ranks itself: leave out --rank and --world-size");
    if (l.master_addr.empty()) l.master_addr = "127.0.0.1";
    check_timeouts(l);
    l.launcher = "--gpus";
    return l;
  }
  const Launcher from = pick_launcher(l, getenv);
  if (l.rank < 0 && l.world_size == 0) {  // a single-process run
    l.launcher.clear();
    return l;
  }
  if (l.world_size < 1)
    throw ConfigError(fmt::format("rank {} given without a world size >= 1 ({})", l.rank, from.size_names));
  if (l.rank < 0 || l.rank >= l.world_size)
    throw ConfigError(fmt::format("rank {} is not in 0..{} (world size {}; {})", l.rank, l.world_size - 1,
                                  l.world_size, from.rank_names));
  // LOCAL_RANK, MASTER_PORT and MASTER_ADDR win over a launcher's own values:
  // they are how a user corrects what the launcher would give.
  if (l.local_rank < 0) l.local_rank = int_var(getenv, "LOCAL_RANK", -1);
  if (l.local_rank < 0 && from.local_rank_var) l.local_rank = int_var(getenv, from.local_rank_var, -1);
  if (l.local_rank < 0) l.local_rank = l.rank;
  if (l.master_port == 0) l.master_port = int_var(getenv, "MASTER_PORT", 0);
  if (l.master_port == 0) l.master_port = from.kind == Kind::slurm ? slurm_port(var(getenv, "SLURM_JOB_ID")) : 29500;
  if (l.master_port < 1 || l.master_port > 65535)
    throw ConfigError(fmt::format("master port {} is not in 1..65535 (--master-port or MASTER_PORT)", l.master_port));
  if (l.master_addr.empty())
    if (const char* v = var(getenv, "MASTER_ADDR")) l.master_addr = v;
  if (l.master_addr.empty()) l.master_addr = default_master_addr(from.kind, l.world_size, getenv);
  check_timeouts(l);
  return l;
}

RankLaunch resolve_rank_launch(RankLaunch cli) {
  return resolve_rank_launch(std::move(cli), [](const char* name) -> const char* { return std::getenv(name); });
}

}  // namespace sg::app
