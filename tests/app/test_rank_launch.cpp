// How a data-parallel run is launched (issue 25), no GPU needed: the rank
// options from the command line or the torchrun variables (read only in
// apps/rank_launch.cpp), their errors, the supervisor's child command line,
// and the supervisor ending every rank when one fails (no rank left waiting).
#include <doctest/doctest.h>

#include <chrono>
#include <map>
#include <random>

#include "apps/config/train_config.hpp"
#include "apps/data_parallel_run.hpp"
#include "apps/inspect_command.hpp"
#include "apps/rank_launch.hpp"
#include "apps/rank_supervisor.hpp"
#include "apps/training_run.hpp"
#include "runtime/io/checkpoint.hpp"
#include "tests/support/test_data.hpp"

using namespace sg;
using app::RankLaunch;
namespace fs = std::filesystem;

namespace {

// resolve_rank_launch with these variables as the environment.
RankLaunch resolve(RankLaunch cli, std::map<std::string, std::string> env) {
  return app::resolve_rank_launch(cli, [&env](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

double seconds_of(const std::function<int()>& f, int& rc) {
  const auto t = std::chrono::steady_clock::now();
  rc = f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

TEST_CASE("rank launch: no options and no variables is a single-process run") {
  const RankLaunch l = resolve({}, {});
  CHECK_FALSE(l.data_parallel());
  CHECK(l.gpus == 0);
}

TEST_CASE("rank launch: the torchrun variables fill what the command line leaves unset") {
  const RankLaunch l = resolve({}, {{"MASTER_ADDR", "10.0.0.7"}, {"MASTER_PORT", "29612"}, {"RANK", "3"},
                                    {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}});
  CHECK(l.data_parallel());
  CHECK(l.rank == 3);
  CHECK(l.world_size == 8);
  CHECK(l.local_rank == 1);
  CHECK(l.master_addr == "10.0.0.7");
  CHECK(l.master_port == 29612);
  // Defaults: local rank = rank, 127.0.0.1:29500.
  const RankLaunch d = resolve({}, {{"RANK", "1"}, {"WORLD_SIZE", "2"}});
  CHECK(d.local_rank == 1);
  CHECK(d.master_addr == "127.0.0.1");
  CHECK(d.master_port == 29500);
  // Command-line options win over the variables.
  RankLaunch cli;
  cli.rank = 0;
  cli.world_size = 2;
  cli.master_port = 4000;
  const RankLaunch c = resolve(cli, {{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"MASTER_PORT", "5000"}});
  CHECK(c.rank == 0);
  CHECK(c.world_size == 2);
  CHECK(c.master_port == 4000);
}

TEST_CASE("rank launch: bad values name the option or variable") {
  CHECK_THROWS_WITH_AS(resolve({}, {{"RANK", "x"}, {"WORLD_SIZE", "2"}}),
                       "environment variable RANK='x' is not an integer", app::ConfigError);
  CHECK_THROWS_WITH_AS(resolve({}, {{"RANK", "2"}, {"WORLD_SIZE", "2"}}),
                       "rank 2 is not in 0..1 (world size 2; --rank or RANK)", app::ConfigError);
  CHECK_THROWS_WITH_AS(resolve({}, {{"RANK", "1"}}),
                       "rank 1 given without a world size >= 1 (--world-size or WORLD_SIZE)", app::ConfigError);
  CHECK_THROWS_WITH_AS(resolve({}, {{"WORLD_SIZE", "2"}}), doctest::Contains("rank -1 is not in 0..1"),
                       app::ConfigError);
  CHECK_THROWS_WITH_AS(resolve({}, {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}),
                       doctest::Contains("master port 70000"), app::ConfigError);
  RankLaunch both;
  both.gpus = 2;
  both.rank = 0;
  CHECK_THROWS_WITH_AS(resolve(both, {}), doctest::Contains("--gpus starts and numbers the ranks itself"),
                       app::ConfigError);
  // --gpus ignores the variables: the supervisor numbers its ranks.
  RankLaunch gpus;
  gpus.gpus = 2;
  const RankLaunch g = resolve(gpus, {{"RANK", "5"}, {"WORLD_SIZE", "9"}});
  CHECK(g.gpus == 2);
  CHECK_FALSE(g.data_parallel());
}

TEST_CASE("rank launch: the ranks get the command line without --gpus") {
  const char* argv[] = {"stepgraph", "train", "--gpus", "2", "-c", "x.yaml", "--gpus=4", "--set", "run.steps=5"};
  CHECK(app::rank_child_args(9, argv) == std::vector<std::string>{"train", "-c", "x.yaml", "--set", "run.steps=5"});
}

TEST_CASE("rank supervisor: every rank succeeding is success, one failing ends the others at once") {
  RankLaunch l;
  l.gpus = 3;
  l.master_addr = "127.0.0.1";
  l.master_port = 29999;  // not opened: the ranks here are shell scripts
  int rc = -1;
  // sh -c SCRIPT --rank R --world-size 3 ...: $0 is "--rank", $1 the rank.
  const double ok = seconds_of([&] { return app::supervise_ranks(l, "/bin/sh", {"-c", "exit 0"}, nullptr, nullptr); }, rc);
  CHECK(rc == 0);
  CHECK(ok < 5.0);
  // Rank 1 fails after 0.2 s; ranks 0 and 2 would wait 60 s (as a rank waits in a collective for a dead peer).
  const double failed = seconds_of(
      [&] {
        return app::supervise_ranks(l, "/bin/sh", {"-c", "if [ \"$1\" = 1 ]; then sleep 0.2; exit 3; fi; exec sleep 60"},
                                    nullptr, nullptr);
      },
      rc);
  CHECK(rc == 3);
  CHECK(failed < 15.0);  // SIGTERM ends the waiting ranks; nothing hangs
  // A rank killed by a signal.
  const double killed =
      seconds_of([&] { return app::supervise_ranks(l, "/bin/sh", {"-c", "if [ \"$1\" = 2 ]; then kill -9 $$; fi; exec sleep 60"},
                                                   nullptr, nullptr); },
                 rc);
  CHECK(rc == 128 + 9);
  CHECK(killed < 15.0);
  // A stop request (Ctrl-C) ends every rank.
  std::atomic<bool> stop{true};
  const volatile int sig = 2;
  const double stopped =
      seconds_of([&] { return app::supervise_ranks(l, "/bin/sh", {"-c", "exec sleep 60"}, &stop, &sig); }, rc);
  CHECK(rc == 130);
  CHECK(stopped < 15.0);
}

TEST_CASE("checkpoints record the rank count, a resume at another one is refused with one line") {
  const fs::path out = fs::temp_directory_path() / ("stepgraph-ranks-" + std::to_string(std::random_device{}()));
  const auto config = [&](std::vector<std::string> extra) {
    extra.push_back("data.dir=" + sg::test::mnist_dir_or_skip().string());
    extra.push_back("run.out_dir=" + out.string());
    extra.push_back("run.steps=20");
    extra.push_back("run.eval_every=0");
    return app::load_config(sg::test::source_dir() / "configs/ci_small.yaml", extra);
  };
  const fs::path ckpt = out / "single.sgck";
  app::run_training(config({"run.checkpoint=" + ckpt.string()}));
  io::Checkpoint c = io::load_checkpoint(ckpt);
  CHECK(app::data_parallel_ranks_of(c.tensors) == 0);  // a single-process run writes no entry
  // The same checkpoint as a 2-rank run would have written it.
  c.tensors.push_back(app::data_parallel_ranks_blob(2));
  CHECK(app::data_parallel_ranks_of(c.tensors) == 2);
  CHECK(app::without_data_parallel_ranks(c.tensors).size() + 1 == c.tensors.size());
  const fs::path two = out / "two_ranks.sgck";
  io::save_checkpoint(two, c);
  CHECK_THROWS_WITH_AS(app::run_training(config({"run.resume=" + two.string(), "run.steps=40"})),
                       doctest::Contains("was written by a data-parallel run over 2 ranks but this run is a "
                                         "single-process run; resume it as it was written (--gpus 2)"),
                       app::ConfigError);
  // A data-parallel rank refuses a single-process checkpoint before anything else (no GPU needed to get there).
  RankLaunch rank;
  rank.rank = 0;
  rank.world_size = 2;
  CHECK_THROWS_WITH_AS(app::run_training(config({"run.resume=" + ckpt.string(), "run.steps=40"}), {}, rank),
                       doctest::Contains("was written by a single-process run but this run is data parallel over 2 "
                                         "ranks; resume it as it was written (without --gpus)"),
                       app::ConfigError);
  // ... and a config that cannot run data parallel says so (ci_small is backend.kind: cpu).
  CHECK_THROWS_WITH_AS(app::run_training(config({}), {}, rank), doctest::Contains("backend.kind: cpu, but data-parallel"),
                       app::ConfigError);
  fs::remove_all(out);
}

TEST_CASE("inspect --world-size shows one rank's graph: its batch slice and one all_reduce_mean per layer") {
  const auto config = app::load_config(sg::test::source_dir() / "configs/ci_small.yaml", {});
  app::InspectRequest r;
  r.world_size = 2;
  r.rank = 1;
  const std::string text = app::run_inspect(config, r);
  CHECK(text.find("{batch=32,rank=1/2}") != std::string::npos);
  std::size_t buckets = 0;
  for (auto at = text.find("all_reduce_mean("); at != std::string::npos; at = text.find("all_reduce_mean(", at + 1)) ++buckets;
  CHECK(buckets == 2);  // 784-64-10: two layers
  const std::string single = app::run_inspect(config, app::InspectRequest{});
  CHECK(single.find("all_reduce_mean") == std::string::npos);
  CHECK(single.find("{batch=32}") != std::string::npos);
  r.rank = 2;
  CHECK_THROWS_WITH_AS(app::run_inspect(config, r), "inspect: --rank 2 is not in 0..1 (--world-size 2)", app::ConfigError);
}
