// stepgraph: train a network from a YAML config, inspect its graphs, benchmark
// graph replay against stream launches and PyTorch.
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "apps/backend_flags.hpp"
#include "apps/bench_command.hpp"
#include "apps/console_log.hpp"
#include "apps/data_parallel_run.hpp"
#include "apps/export_command.hpp"
#include "apps/predict_command.hpp"
#include "apps/inspect_command.hpp"
#include "apps/profile_command.hpp"
#include "apps/rank_supervisor.hpp"
#include "apps/run_lock.hpp"
#include "apps/training_run.hpp"

namespace {

std::atomic<bool> g_stop_requested{false};
// Set once training steps begin (or a supervisor starts its ranks): before,
// during the config, the data load and the backend's construction, there is
// nothing to checkpoint.
std::atomic<bool> g_training_started{false};
volatile std::sig_atomic_t g_stop_signal = SIGINT;

// SIGINT (Ctrl-C) and SIGTERM (schedulers, timeout) before training exit at
// once (128 + signal), removing the run's lock file and any folder it
// created. Once training, they stop it after the current launch (or eval
// batch) and write a checkpoint; exit 128 + signal (130 / 143). A second
// signal exits at once, without a checkpoint.
extern "C" void on_stop_signal(int sig) {
  if (!g_training_started.load()) {
    static const char msg[] = "\nstepgraph: stopped before training started: nothing to checkpoint\n";
    [[maybe_unused]] const auto n = ::write(STDERR_FILENO, msg, sizeof msg - 1);
    sg::app::abandon_run_outputs_from_signal();
    std::_Exit(128 + sig);
  }
  if (g_stop_requested.exchange(true)) {
    static const char msg[] = "\nstepgraph: second interrupt: exiting now, without a checkpoint\n";
    [[maybe_unused]] const auto n = ::write(STDERR_FILENO, msg, sizeof msg - 1);
    sg::app::abandon_run_outputs_from_signal();  // the lock file (the run's folders stay: it has outputs)
    std::_Exit(128 + sig);
  }
  g_stop_signal = sig;
  static const char msg[] = "\nstepgraph: stopping after the current launch to write a checkpoint (again to exit now)\n";
  [[maybe_unused]] const auto n = ::write(STDERR_FILENO, msg, sizeof msg - 1);
}

struct ConfigArgs {
  std::string path = "configs/mnist_mlp.yaml";
  std::vector<std::string> overrides;
  void add_to(CLI::App& cmd) {
    cmd.add_option("-c,--config", path, "YAML config file")->capture_default_str();
    cmd.add_option("--set", overrides, "override a config key, e.g. --set optim.lr=0.1 (repeatable)");
    sg::app::add_core_only_flag(cmd, overrides);  // --core-only: no fast path (issue 35)
  }
  sg::app::TrainConfig load() const { return sg::app::load_config(path, overrides); }
};

int train(const ConfigArgs& args, const sg::app::RankLaunch& cli_launch, int argc, char** argv) {
  // First thing: a stop while a huge config parses or the data loads must end the process.
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  const auto launch = sg::app::resolve_rank_launch(cli_launch);  // --gpus, --rank ... or the torchrun variables
  if (launch.gpus > 0) {  // start and supervise the ranks; this process trains nothing
    sg::app::check_can_supervise(args.load(), launch.gpus);  // a bad config fails here once, not in every rank
    g_training_started = true;  // from here a stop is forwarded to the ranks, which write the checkpoint
    return sg::app::supervise_ranks(launch, "/proc/self/exe", sg::app::rank_child_args(argc, argv), &g_stop_requested,
                                    &g_stop_signal);
  }
  if (launch.data_parallel()) {
    // A rank stops with its supervisor or launcher (default SIGINT/SIGTERM
    // action): ranks stopping at different steps could not agree on a checkpoint.
    std::signal(SIGINT, SIG_DFL);
    std::signal(SIGTERM, SIG_DFL);
    spdlog::set_pattern(fmt::format("[%Y-%m-%d %H:%M:%S.%e] [rank {}] [%^%l%$] %v", launch.rank));
    if (launch.rank > 0) spdlog::set_level(spdlog::level::warn);  // rank 0 reports the run
  }
  const auto config = args.load();
  const auto summary = sg::app::run_training(
      config, {&g_stop_requested, ::isatty(STDOUT_FILENO) != 0 && launch.rank <= 0, true, &g_training_started}, launch);
  if (summary.interrupted) return 128 + g_stop_signal;
  if (launch.rank > 0) return 0;  // rank 0 prints the result
  if (std::isnan(summary.final_eval.accuracy))  // a regression run (model.loss mse/l1): test loss only
    std::printf("test loss %.4f  (final train loss %.4f, %lld steps, %.2f s, %s)\n", summary.final_eval.loss,
                summary.final_train_loss, static_cast<long long>(summary.steps), summary.seconds,
                summary.backend.c_str());
  else
    std::printf("test accuracy %.2f%%  (test loss %.4f, final train loss %.4f, %lld steps, %.2f s, %s)\n",
                100 * summary.final_eval.accuracy, summary.final_eval.loss, summary.final_train_loss,
                static_cast<long long>(summary.steps), summary.seconds, summary.backend.c_str());
  return g_stop_requested ? 128 + g_stop_signal : 0;  // a stop that came after the final evaluation still says so
}

}  // namespace

int main(int argc, char** argv) {
  sg::app::use_console_log();
  CLI::App app{"stepgraph: one captured CUDA graph per training step (MLPs, CNNs, residual models)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "stepgraph " STEPGRAPH_VERSION);

  ConfigArgs train_args;
  auto* train_cmd = app.add_subcommand("train", "train as configured (IDX, .npy/.npz or CSV data)");
  train_args.add_to(*train_cmd);
  sg::app::RankLaunch rank_launch;
  sg::app::add_rank_options(*train_cmd, rank_launch);

  ConfigArgs inspect_args;
  sg::app::InspectRequest inspect_request;
  auto* inspect_cmd = app.add_subcommand("inspect", "dump the graph, schedule, memory plan or CUDA graph");
  inspect_args.add_to(*inspect_cmd);
  inspect_cmd->add_option("-f,--format", inspect_request.format, "text | json | dot | schedule | memory | cuda-graph")
      ->capture_default_str();
  inspect_cmd->add_option("-s,--stage", inspect_request.stage, "forward | backward | optimized | fused | eval")
      ->capture_default_str();
  inspect_cmd->add_option("-o,--out", inspect_request.out, "write to this file instead of stdout");
  inspect_cmd->add_option("--world-size", inspect_request.world_size,
                          "data parallel: the graphs of one of N ranks (all_reduce_mean buckets, sharded fetch)");
  inspect_cmd->add_option("--rank", inspect_request.rank, "data parallel: which rank's graphs (with --world-size)");

  sg::app::BenchRequest bench_request;
  auto* bench_cmd = app.add_subcommand("bench", "time graph replay vs stream launches (and merge PyTorch numbers)");
  sg::app::add_bench_options(*bench_cmd, bench_request);

  ConfigArgs profile_args;
  sg::app::ProfileRequest profile_request;
  auto* profile_cmd = app.add_subcommand("profile", "where a step's time goes: per-launch table, CSV/JSON/SVG, Perfetto trace");
  profile_args.add_to(*profile_cmd);
  sg::app::add_profile_options(*profile_cmd, profile_request);

  sg::app::ExportRequest export_request;
  auto* export_cmd = app.add_subcommand("export", "write a checkpoint's model as safetensors (PyTorch) or ONNX");
  sg::app::add_export_options(*export_cmd, export_request);

  sg::app::PredictRequest predict_request;
  auto* predict_cmd = app.add_subcommand("predict", "run a checkpoint's model over an .npy file; write predictions as .npy");
  sg::app::add_predict_options(*predict_cmd, predict_request);

  if (argc > 1 && argv[1][0] != '-') {  // CLI11 would only say "A subcommand is required"
    std::string known;
    bool found = false;
    for (const auto* sub : app.get_subcommands({})) {
      known += (known.empty() ? "" : ", ") + sub->get_name();
      found = found || sub->get_name() == argv[1];
    }
    if (!found) {
      std::fprintf(stderr, "stepgraph: unknown subcommand '%s' (known: %s; see --help)\n", argv[1], known.c_str());
      return static_cast<int>(CLI::ExitCodes::ExtrasError);
    }
  }
  CLI11_PARSE(app, argc, argv);
  try {
    if (*train_cmd) return train(train_args, rank_launch, argc, argv);
    if (*inspect_cmd) {
      if (inspect_request.out.empty()) sg::app::use_console_log(/*every_line_to_stderr=*/true);  // stdout: the dump
      const auto dump = sg::app::run_inspect(inspect_args.load(), inspect_request);
      if (inspect_request.out.empty()) std::fwrite(dump.data(), 1, dump.size(), stdout);
      else spdlog::info("wrote {} ({} bytes)", inspect_request.out, dump.size());
      return 0;
    }
    if (*bench_cmd) return sg::app::run_bench(bench_request);
    if (*profile_cmd) return sg::app::run_profile(profile_args.load(), profile_request);
    if (*export_cmd) return sg::app::run_export(export_request);
    if (*predict_cmd) return sg::app::run_predict(predict_request);
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
  return 0;
}
