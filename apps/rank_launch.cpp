#include "apps/rank_launch.hpp"

#include <cerrno>
#include <cstdlib>

#include <fmt/format.h>

#include "apps/config/train_config.hpp"

namespace sg::app {
namespace {

// The integer in `text`, or a ConfigError naming `what`.
int parse_int(const char* text, const std::string& what) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || errno != 0 || v < -1'000'000 || v > 1'000'000)
    throw ConfigError(fmt::format("{}='{}' is not an integer", what, text));
  return static_cast<int>(v);
}

}  // namespace

void add_rank_options(CLI::App& cmd, RankLaunch& l) {
  cmd.add_option("--gpus", l.gpus, "data parallel: start N ranks on this machine's GPUs and supervise them (NCCL)");
  cmd.add_option("--rank", l.rank, "data parallel: this process's rank (else RANK)");
  cmd.add_option("--world-size", l.world_size, "data parallel: number of ranks (else WORLD_SIZE)");
  cmd.add_option("--local-rank", l.local_rank, "data parallel: this rank's GPU on its machine (else LOCAL_RANK, else the rank)");
  cmd.add_option("--master-addr", l.master_addr, "data parallel: where rank 0 listens (else MASTER_ADDR, else 127.0.0.1)");
  cmd.add_option("--master-port", l.master_port, "data parallel: rank 0's TCP port (else MASTER_PORT, else 29500)");
  cmd.add_option("--rendezvous-timeout", l.timeout_s, "data parallel: seconds to wait for every rank")->capture_default_str();
}

RankLaunch resolve_rank_launch(RankLaunch l, const std::function<const char*(const char*)>& getenv) {
  const auto from_env = [&](int& field, bool unset, const char* name) {
    if (!unset) return;
    if (const char* v = getenv(name); v && *v) field = parse_int(v, fmt::format("environment variable {}", name));
  };
  if (l.gpus < 0) throw ConfigError(fmt::format("--gpus {} must be >= 1", l.gpus));
  if (l.gpus > 0) {
    if (l.rank >= 0 || l.world_size > 0)
      throw ConfigError("--gpus starts and numbers the ranks itself: leave out --rank and --world-size");
    if (l.master_addr.empty()) l.master_addr = "127.0.0.1";
    if (!(l.timeout_s > 0)) throw ConfigError(fmt::format("--rendezvous-timeout {} must be > 0", l.timeout_s));
    return l;
  }
  const bool cli_group = l.rank >= 0 || l.world_size > 0;
  if (!cli_group) {  // a launcher's variables, all or none of RANK and WORLD_SIZE
    from_env(l.rank, true, "RANK");
    from_env(l.world_size, true, "WORLD_SIZE");
  }
  if (l.rank < 0 && l.world_size == 0) return l;  // a single-process run
  if (l.world_size < 1)
    throw ConfigError(fmt::format("rank {} given without a world size >= 1 (--world-size or WORLD_SIZE)", l.rank));
  if (l.rank < 0 || l.rank >= l.world_size)
    throw ConfigError(fmt::format("rank {} is not in 0..{} (world size {}; --rank or RANK)", l.rank, l.world_size - 1,
                                  l.world_size));
  from_env(l.local_rank, l.local_rank < 0, "LOCAL_RANK");
  if (l.local_rank < 0) l.local_rank = l.rank;
  from_env(l.master_port, l.master_port == 0, "MASTER_PORT");
  if (l.master_port == 0) l.master_port = 29500;
  if (l.master_port < 1 || l.master_port > 65535)
    throw ConfigError(fmt::format("master port {} is not in 1..65535 (--master-port or MASTER_PORT)", l.master_port));
  if (l.master_addr.empty())
    if (const char* v = getenv("MASTER_ADDR"); v && *v) l.master_addr = v;
  if (l.master_addr.empty()) l.master_addr = "127.0.0.1";
  if (!(l.timeout_s > 0)) throw ConfigError(fmt::format("--rendezvous-timeout {} must be > 0", l.timeout_s));
  return l;
}

RankLaunch resolve_rank_launch(RankLaunch cli) {
  return resolve_rank_launch(std::move(cli), [](const char* name) -> const char* { return std::getenv(name); });
}

}  // namespace sg::app
