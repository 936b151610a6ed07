// How a data-parallel run is launched (issue 25), no GPU needed: the rank
// options from the command line, the torchrun variables, Slurm's or Open MPI's
// (read only in apps/rank_launch.cpp), their errors, the supervisor's child command line,
// and the supervisor ending every rank when one fails (no rank left waiting).
#include <doctest/doctest.h>

#include <chrono>
#include <map>
#include <random>

#include <fmt/format.h>

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
  // The silence limit for a stopped or hung rank: too short would lose ranks merely slow to be scheduled.
  for (RankLaunch short_limit : {gpus, RankLaunch{}}) {
    short_limit.peer_timeout_s = 1.5;
    CHECK_THROWS_WITH_AS(resolve(short_limit, {{"RANK", "0"}, {"WORLD_SIZE", "2"}}),
                         "--peer-timeout 1.5 must be >= 2 (seconds; heartbeats go every 0.5 s)", app::ConfigError);
  }
  CHECK(resolve({}, {{"RANK", "0"}, {"WORLD_SIZE", "2"}}).peer_timeout_s == 30);
}

TEST_CASE("rank launch: srun's variables give rank, world size, local rank, master address and port") {
  const std::map<std::string, std::string> slurm = {{"SLURM_PROCID", "5"},
                                                    {"SLURM_NTASKS", "8"},
                                                    {"SLURM_LOCALID", "1"},
                                                    {"SLURM_JOB_NODELIST", "gpu-node[03-05,07],login1"},
                                                    {"SLURM_JOB_ID", "123456"}};
  const RankLaunch l = resolve({}, slurm);
  CHECK(l.data_parallel());
  CHECK(l.launcher == "Slurm");
  CHECK(l.rank == 5);
  CHECK(l.world_size == 8);
  CHECK(l.local_rank == 1);
  CHECK(l.master_addr == "gpu-node03");
  CHECK(l.master_port == 29500 + 456);  // 29500 + SLURM_JOB_ID mod 1000
  // The port: a job id too long for an int still works digit by digit; no integer job id: 29500.
  const auto port_of = [&](const char* job_id) {
    auto env = slurm;
    if (job_id) env["SLURM_JOB_ID"] = job_id;
    else env.erase("SLURM_JOB_ID");
    return resolve({}, env).master_port;
  };
  CHECK(port_of("99999999999999999999") == 29500 + 999);
  CHECK(port_of("7") == 29507);
  CHECK(port_of("12a") == 29500);
  CHECK(port_of(nullptr) == 29500);
  // Without SLURM_LOCALID the local rank is the rank, as for torchrun.
  auto no_local = slurm;
  no_local.erase("SLURM_LOCALID");
  CHECK(resolve({}, no_local).local_rank == 5);
}

TEST_CASE("rank launch: the first host of a Slurm node list") {
  CHECK(app::first_slurm_host("gpu-node[03-05,07],login1") == "gpu-node03");
  CHECK(app::first_slurm_host("n1,n2") == "n1");
  CHECK(app::first_slurm_host("node[7]") == "node7");
  CHECK(app::first_slurm_host("a[001-004]") == "a001");
  CHECK(app::first_slurm_host("rack1-node[2-3]") == "rack1-node2");
  CHECK(app::first_slurm_host("solo") == "solo");
  CHECK(app::first_slurm_host("r[2-3]n[010,12]") == "r2n010");  // one group per dimension
  CHECK(app::first_slurm_host("x[9,1-2],y[1]") == "x9");         // as written, not the smallest
  const std::pair<const char*, const char*> bad[] = {{"", "it is empty"},
                                                     {"gpu[1-2", "'[' without ']'"},
                                                     {"gpu1-2]", "']' without '['"},
                                                     {"a[1]]", "']' without '['"},
                                                     {"a[[1]]", "'[' inside brackets"},
                                                     {",n1", "its first host is empty"},
                                                     {"node[]", "a bracket that does not start with a number"},
                                                     {"node[a-b]", "a bracket that does not start with a number"}};
  for (const auto& [list, why] : bad) {
    const std::string text =
        fmt::format("environment variable SLURM_JOB_NODELIST='{}' is not a Slurm host list: {}", list, why);
    CHECK_THROWS_WITH_AS(app::first_slurm_host(list), text.c_str(), app::ConfigError);
  }
}

TEST_CASE("rank launch: the command line, MASTER_ADDR/PORT, LOCAL_RANK win over Slurm, one task is a single process") {
  const std::map<std::string, std::string> slurm = {{"SLURM_PROCID", "3"},
                                                    {"SLURM_NTASKS", "4"},
                                                    {"SLURM_LOCALID", "3"},
                                                    {"SLURM_JOB_NODELIST", "n[1-2]"},
                                                    {"SLURM_JOB_ID", "42"}};
  auto env = slurm;
  env["MASTER_ADDR"] = "10.1.2.3";
  env["MASTER_PORT"] = "31000";
  env["LOCAL_RANK"] = "0";
  const RankLaunch m = resolve({}, env);
  CHECK(m.launcher == "Slurm");
  CHECK(m.rank == 3);
  CHECK(m.master_addr == "10.1.2.3");
  CHECK(m.master_port == 31000);
  CHECK(m.local_rank == 0);
  RankLaunch addr;
  addr.master_addr = "head";
  addr.master_port = 4000;
  addr.local_rank = 2;
  const RankLaunch a = resolve(addr, env);
  CHECK(a.launcher == "Slurm");
  CHECK(a.master_addr == "head");
  CHECK(a.master_port == 4000);
  CHECK(a.local_rank == 2);
  // --rank/--world-size: the command line is the launcher, nothing comes from Slurm.
  RankLaunch cli;
  cli.rank = 1;
  cli.world_size = 2;
  const RankLaunch c = resolve(cli, slurm);
  CHECK(c.launcher == "command line");
  CHECK(c.rank == 1);
  CHECK(c.world_size == 2);
  CHECK(c.local_rank == 1);
  CHECK(c.master_addr == "127.0.0.1");
  CHECK(c.master_port == 29500);
  // One task (a one-task job, or stepgraph run in the batch script itself): single process.
  auto one = slurm;
  one["SLURM_PROCID"] = "0";
  one["SLURM_NTASKS"] = "1";
  const RankLaunch s = resolve({}, one);
  CHECK_FALSE(s.data_parallel());
  CHECK(s.rank == -1);
  CHECK(s.launcher.empty());
  auto no_procid = slurm;
  no_procid.erase("SLURM_PROCID");
  CHECK_FALSE(resolve({}, no_procid).data_parallel());
}

TEST_CASE("rank launch: bad Slurm values name the variable") {
  const std::map<std::string, std::string> slurm = {
      {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_JOB_NODELIST", "n[1-2]"}};
  auto env = slurm;
  env["SLURM_PROCID"] = "x";
  CHECK_THROWS_WITH_AS(resolve({}, env), "environment variable SLURM_PROCID='x' is not an integer", app::ConfigError);
  env = slurm;
  env["SLURM_PROCID"] = "4";
  CHECK_THROWS_WITH_AS(resolve({}, env), "rank 4 is not in 0..3 (world size 4; SLURM_PROCID/SLURM_NTASKS)",
                       app::ConfigError);
  env = slurm;
  env["SLURM_NTASKS"] = "4x";
  CHECK_THROWS_WITH_AS(resolve({}, env), "environment variable SLURM_NTASKS='4x' is not an integer", app::ConfigError);
  env = slurm;
  env["SLURM_JOB_NODELIST"] = "n[1-2";
  CHECK_THROWS_WITH_AS(resolve({}, env),
                       "environment variable SLURM_JOB_NODELIST='n[1-2' is not a Slurm host list: '[' without ']'",
                       app::ConfigError);
  env["MASTER_ADDR"] = "n1";  // not read when the address is given
  CHECK(resolve({}, env).master_addr == "n1");
  env = slurm;
  env.erase("SLURM_JOB_NODELIST");
  CHECK_THROWS_WITH_AS(resolve({}, env), doctest::Contains("Slurm started 4 tasks but SLURM_JOB_NODELIST is not set"),
                       app::ConfigError);
}

TEST_CASE("rank launch: mpirun's variables, several machines need MASTER_ADDR") {
  const RankLaunch l = resolve({}, {{"OMPI_COMM_WORLD_RANK", "2"},
                                    {"OMPI_COMM_WORLD_SIZE", "4"},
                                    {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                    {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
  CHECK(l.data_parallel());
  CHECK(l.launcher == "Open MPI");
  CHECK(l.rank == 2);
  CHECK(l.world_size == 4);
  CHECK(l.local_rank == 1);
  CHECK(l.master_addr == "127.0.0.1");  // every rank on this machine
  CHECK(l.master_port == 29500);
  // mpirun -np 1: a world of one.
  const RankLaunch one = resolve({}, {{"OMPI_COMM_WORLD_RANK", "0"},
                                      {"OMPI_COMM_WORLD_SIZE", "1"},
                                      {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}});
  CHECK(one.data_parallel());
  CHECK(one.world_size == 1);
  CHECK(one.launcher == "Open MPI");
  // Two machines: rank 0's address cannot be guessed.
  std::map<std::string, std::string> two = {{"OMPI_COMM_WORLD_RANK", "5"},
                                            {"OMPI_COMM_WORLD_SIZE", "8"},
                                            {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                            {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}};
  CHECK_THROWS_WITH_AS(resolve({}, two),
                       "Open MPI started 8 ranks on several machines (OMPI_COMM_WORLD_LOCAL_SIZE 4 < "
                       "OMPI_COMM_WORLD_SIZE 8): give rank 0's address with --master-addr or MASTER_ADDR "
                       "(mpirun -x MASTER_ADDR=...)",
                       app::ConfigError);
  RankLaunch addr;
  addr.master_addr = "node0";
  CHECK(resolve(addr, two).master_addr == "node0");
  two["MASTER_ADDR"] = "10.0.0.1";
  two["MASTER_PORT"] = "29612";
  const RankLaunch m = resolve({}, two);
  CHECK(m.rank == 5);
  CHECK(m.world_size == 8);
  CHECK(m.local_rank == 1);
  CHECK(m.master_addr == "10.0.0.1");
  CHECK(m.master_port == 29612);
  CHECK_THROWS_WITH_AS(resolve({}, {{"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "4"}}),
                       "rank 4 is not in 0..3 (world size 4; OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE)",
                       app::ConfigError);
  CHECK_THROWS_WITH_AS(resolve({}, {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "0"}}),
                       "rank 0 given without a world size >= 1 (OMPI_COMM_WORLD_SIZE)", app::ConfigError);
  // Only the rank: not an Open MPI launch.
  CHECK_FALSE(resolve({}, {{"OMPI_COMM_WORLD_RANK", "1"}}).data_parallel());
}

TEST_CASE("rank launch: torchrun variables win over Open MPI and Slurm, Open MPI over Slurm, --gpus over all") {
  const std::map<std::string, std::string> ompi = {{"OMPI_COMM_WORLD_RANK", "2"},
                                                   {"OMPI_COMM_WORLD_SIZE", "4"},
                                                   {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                                                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}};
  const std::map<std::string, std::string> slurm = {{"SLURM_PROCID", "0"},
                                                    {"SLURM_NTASKS", "8"},
                                                    {"SLURM_LOCALID", "0"},
                                                    {"SLURM_JOB_NODELIST", "n[1-2]"},
                                                    {"SLURM_JOB_ID", "77"}};
  auto all = ompi;
  all.insert(slurm.begin(), slurm.end());
  // mpirun inside an allocation: its ranks inherit the allocation's SLURM_* but are mpirun's.
  const RankLaunch o = resolve({}, all);
  CHECK(o.launcher == "Open MPI");
  CHECK(o.rank == 2);
  CHECK(o.world_size == 4);
  CHECK(o.local_rank == 2);
  CHECK(o.master_addr == "127.0.0.1");
  CHECK(o.master_port == 29500);
  all["RANK"] = "1";
  all["WORLD_SIZE"] = "3";
  const RankLaunch t = resolve({}, all);
  CHECK(t.launcher == "torchrun variables");
  CHECK(t.rank == 1);
  CHECK(t.world_size == 3);
  CHECK(t.local_rank == 1);  // not OMPI_COMM_WORLD_LOCAL_RANK or SLURM_LOCALID
  CHECK(t.master_addr == "127.0.0.1");
  CHECK(t.master_port == 29500);
  // --gpus starts its own ranks whatever the launcher's variables say.
  RankLaunch gpus;
  gpus.gpus = 2;
  const RankLaunch g = resolve(gpus, all);
  CHECK(g.launcher == "--gpus");
  CHECK(g.gpus == 2);
  CHECK_FALSE(g.data_parallel());
  CHECK(g.master_addr == "127.0.0.1");
  CHECK(resolve(gpus, slurm).launcher == "--gpus");
  RankLaunch both = gpus;
  both.world_size = 2;
  CHECK_THROWS_WITH_AS(resolve(both, slurm), doctest::Contains("--gpus starts and numbers the ranks itself"),
                       app::ConfigError);
  // The launcher of the other sources.
  CHECK(resolve({}, {}).launcher.empty());
  CHECK(resolve({}, {{"RANK", "0"}, {"WORLD_SIZE", "2"}}).launcher == "torchrun variables");
  RankLaunch cli;
  cli.rank = 0;
  cli.world_size = 2;
  CHECK(resolve(cli, {}).launcher == "command line");
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
  // data_parallel.bucket_mb 0: a bucket per layer (the default, 4, joins these small layers into one).
  const auto config =
      app::load_config(sg::test::source_dir() / "configs/ci_small.yaml", {"data_parallel.bucket_mb=0"});
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
  // A model.sequential CNN too: rank 1 of 3's slice, one bucket per conv and linear layer.
  const auto cnn_path = sg::test::source_dir() / "configs/mnist_cnn.yaml";
  const auto cnn = app::load_config(cnn_path, {"data_parallel.bucket_mb=0"});
  r.world_size = 3;
  r.rank = 1;
  const auto count_buckets = [](const std::string& dump) {
    std::size_t n = 0;
    for (auto at = dump.find("all_reduce_mean("); at != std::string::npos; at = dump.find("all_reduce_mean(", at + 1))
      ++n;
    return n;
  };
  const std::string cnn_text = app::run_inspect(cnn, r);
  CHECK(cnn_text.find("{batch=64,rank=1/3}") != std::string::npos);
  CHECK(count_buckets(cnn_text) == 4);
  // The default joins the CNN's 87 KB of gradients into one bucket.
  const auto joined = app::load_config(cnn_path, {});
  CHECK(joined.data_parallel.bucket_mb == 4.0);
  CHECK(count_buckets(app::run_inspect(joined, r)) == 1);
  CHECK_THROWS_WITH_AS(app::load_config(cnn_path, {"data_parallel.bucket_mb=-1"}),
                       doctest::Contains("data_parallel.bucket_mb"), app::ConfigError);
  // How NCCL runs the buckets: 32 CTAs and symmetric memory by default; each key read and range-checked.
  CHECK(joined.data_parallel.nccl_ctas == 32);
  CHECK(joined.data_parallel.symmetric_memory);
  const auto tuned = app::load_config(cnn_path, {"data_parallel.nccl_ctas=0", "data_parallel.symmetric_memory=false"});
  CHECK(tuned.data_parallel.nccl_ctas == 0);
  CHECK_FALSE(tuned.data_parallel.symmetric_memory);
  CHECK_THROWS_WITH_AS(app::load_config(cnn_path, {"data_parallel.nccl_ctas=65"}),
                       doctest::Contains("data_parallel.nccl_ctas"), app::ConfigError);
  CHECK_THROWS_WITH_AS(app::load_config(cnn_path, {"data_parallel.symmetric_memory=maybe"}),
                       doctest::Contains("data_parallel.symmetric_memory"), app::ConfigError);
  // ZeRO-1: off by default; on, a rank shards what is large enough (the report CNN: nothing, all buckets stay);
  // refused with clipping, before anything runs.
  CHECK_FALSE(joined.data_parallel.zero1);
  CHECK(joined.data_parallel.zero1_min_mb == 16.0);
  const auto sharded = app::load_config(cnn_path, {"data_parallel.zero1=true", "data_parallel.zero1_min_mb=0"});
  CHECK(sharded.data_parallel.zero1);
  CHECK(sharded.data_parallel.zero1_min_mb == 0.0);
  CHECK_THROWS_WITH_AS(app::load_config(cnn_path, {"data_parallel.zero1_min_mb=-1"}),
                       doctest::Contains("data_parallel.zero1_min_mb"), app::ConfigError);
  CHECK(count_buckets(app::run_inspect(sharded, r)) == 1);
  CHECK_THROWS_WITH_AS(app::load_config(cnn_path, {"data_parallel.zero1=true", "optim.clip_grad_norm=1"}),
                       doctest::Contains("data_parallel.zero1"), app::ConfigError);
  // Weight gradients: "auto" by default (the report CNN's layers all-reduce: one bucket); "gather" gathers the rows
  // of the layers that qualify (the second convolution and the classifier; the rest stay in one bucket); anything
  // else refused before anything runs.
  CHECK(joined.data_parallel.weight_gradients == "auto");
  const auto gathered = app::load_config(cnn_path, {"data_parallel.weight_gradients=gather"});
  CHECK(gathered.data_parallel.weight_gradients == "gather");
  const std::string gathered_schedule = app::run_inspect(gathered, r);
  CHECK(count_buckets(gathered_schedule) == 1);
  CHECK(gathered_schedule.find("all_gather_batch") != std::string::npos);
  CHECK_THROWS_WITH_AS(app::load_config(cnn_path, {"data_parallel.weight_gradients=allgather"}),
                       doctest::Contains("data_parallel.weight_gradients"), app::ConfigError);
}
