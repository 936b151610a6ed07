#pragma once
// `stepgraph train --gpus N` (issue 25): this process trains nothing; it
// starts N copies of the stepgraph binary, one per GPU of this machine, each
// with its rank options (--rank r --world-size N --local-rank r
// --master-addr --master-port) and the rest of the command line unchanged,
// and waits for them. When one fails (non-zero exit or a signal) it says
// which and why, stops the others (SIGTERM, SIGKILL after a grace period)
// and returns non-zero: no rank is left waiting in a collective. Each child
// dies with it (PR_SET_PDEATHSIG) if the supervisor itself is killed.
#include <atomic>
#include <string>
#include <vector>

#include "apps/rank_launch.hpp"

namespace sg::app {

// Runs `program` (stepgraph: /proc/self/exe) once per rank with `args` (the
// command line after the program name, without --gpus: rank_child_args) and
// the rank's options appended. Returns the exit status for the supervisor:
// 0 when every rank succeeded, the first failing rank's status otherwise,
// 128 + signal when `stop` was set (Ctrl-C / SIGTERM, forwarded as SIGTERM).
int supervise_ranks(const RankLaunch& launch, const std::string& program, const std::vector<std::string>& args,
                    const std::atomic<bool>* stop, const volatile int* stop_signal);

// `argv[1..]` without the --gpus option (either "--gpus N" or "--gpus=N").
std::vector<std::string> rank_child_args(int argc, const char* const* argv);

}  // namespace sg::app
