#include "apps/bench_torch.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spawn.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "apps/process_status.hpp"
#include "apps/saved_model.hpp"
#include "runtime/export/safetensors_writer.hpp"
#include "runtime/io/atomic_file.hpp"

extern char** environ;

namespace sg::app {
namespace {

// Runs argv[0] (found on PATH) with stdout to /dev/null (the script's JSON
// line: the --out file has it) and stderr shared (its progress lines);
// returns its wait status.
int run_quietly(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  const int started = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (started != 0)
    throw std::runtime_error(fmt::format("bench --torch: cannot start '{}': {}", args.front(), std::strerror(started)));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) throw std::runtime_error(fmt::format("bench --torch: waitpid: {}", std::strerror(errno)));
  return status;
}

// Whether `program` names an executable file: as given when it holds a
// '/', else in one of PATH's folders (as posix_spawnp looks for it).
bool can_execute(const std::string& program) {
  if (program.find('/') != std::string::npos) return ::access(program.c_str(), X_OK) == 0;
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');)
    if (!dir.empty() && ::access((std::filesystem::path(dir) / program).c_str(), X_OK) == 0) return true;
  return false;
}

}  // namespace

void check_torch_twin(const BenchRequest& r) {
  if (r.config.empty())
    throw ConfigError(
        "bench --torch: times a config's network in PyTorch: give --config (the MLP sweep's PyTorch "
        "side is bench/torch_bench.py, merged with --torch-json)");
  if (!can_execute(r.python))
    throw ConfigError(
        fmt::format("bench --python {}: no such executable (on PATH or as a path): the Python with "
                    "PyTorch that runs --torch's side",
                    r.python));
  if (!std::ifstream(r.torch_script))
    throw ConfigError(
        fmt::format("bench --torch-script {}: not a readable file (bench/torch_sequential.py of the "
                    "stepgraph sources)",
                    r.torch_script));
}

std::vector<std::string> run_torch_twin(const BenchRequest& r, const TrainConfig& config, DType features,
                                        const std::vector<std::int64_t>& batches) {
  const std::filesystem::path dir = r.out_dir;
  std::filesystem::create_directories(dir);
  const SavedModel model = initial_model(config, features);
  const std::string module = (dir / "torch_module.safetensors").string();
  io::write_file_atomically(module, model.sequential ? exporting::safetensors_bytes(exported_graph(model))
                                                     : exporting::safetensors_bytes(exported_mlp(model)));
  // The settings that shape PyTorch's step, as flags (they hold without
  // PyYAML, which the script needs to read --config itself).
  const OptimConfig& o = config.optim;
  std::vector<std::string> args = {r.python,
                                   r.torch_script,
                                   "--module-from",
                                   module,
                                   "--config",
                                   r.config,
                                   "--data",
                                   r.data_dir,
                                   "--mode",
                                   "speed",
                                   "--steps",
                                   std::to_string(r.torch_steps),
                                   "--repeats",
                                   std::to_string(r.repeats),
                                   "--warmup",
                                   std::to_string(r.torch_warmup),
                                   "--modes",
                                   r.torch_modes,
                                   "--seed",
                                   std::to_string(config.run.seed),
                                   "--optim",
                                   o.name,
                                   "--lr",
                                   fmt::format("{}", o.lr),
                                   "--momentum",
                                   fmt::format("{}", o.momentum),
                                   "--weight-decay",
                                   fmt::format("{}", o.weight_decay),
                                   "--betas",
                                   fmt::format("{},{}", o.beta1, o.beta2),
                                   "--eps",
                                   fmt::format("{}", o.eps),
                                   "--alpha",
                                   fmt::format("{}", o.alpha),
                                   "--compute",
                                   config.precision.compute,
                                   "--label-smoothing",
                                   fmt::format("{}", config.model.label_smoothing),
                                   "--set",
                                   fmt::format("model.dropout={}", config.model.dropout)};
  if (o.nesterov) args.push_back("--nesterov");
  if (o.centered) args.push_back("--centered");
  std::vector<std::string> outs;
  for (const std::int64_t batch : batches) {
    const std::string out = (dir / fmt::format("torch_B{}.json", batch)).string();
    std::filesystem::remove(out);  // no stale records if the script fails
    std::vector<std::string> run = args;
    run.insert(run.end(), {"--batch", std::to_string(batch), "--out", out});
    spdlog::info("PyTorch side: {}", fmt::join(run, " "));
    const int status = run_quietly(run);
    if (wait_failed(status))
      throw std::runtime_error(
          fmt::format("bench --torch: {} {} (its messages above)", r.torch_script, describe_wait_status(status)));
    if (!std::filesystem::exists(out))
      throw std::runtime_error(fmt::format("bench --torch: {} wrote no {}", r.torch_script, out));
    outs.push_back(out);
  }
  return outs;
}

}  // namespace sg::app
