#include "apps/data_parallel_run.hpp"

#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "apps/backend_choice.hpp"
#include "runtime/distributed/peer_watchdog.hpp"
#include "runtime/distributed/rendezvous.hpp"
#ifdef STEPGRAPH_HAVE_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda/cuda_trainer.hpp"
#endif
#ifdef STEPGRAPH_HAVE_NCCL
#include "runtime/cuda/nccl_communicator.hpp"
#endif

namespace sg::app {
void check_can_run(const TrainConfig& c) {
  if (c.backend.kind == "cpu")
    throw ConfigError(fmt::format("{}: backend.kind: cpu, but data-parallel training (--gpus, RANK/WORLD_SIZE) runs on "
                                  "the CUDA backend over NCCL",
                                  c.source));
#ifndef STEPGRAPH_HAVE_NCCL
  throw ConfigError("data-parallel training (--gpus, RANK/WORLD_SIZE) needs NCCL, and this stepgraph was built without "
                    "it: install NCCL (Debian: libnccl-dev; pip: nvidia-nccl-cu13) and re-run cmake (NCCL_ROOT names "
                    "another location)");
#endif
  if (!cuda_backend_usable()) throw ConfigError("data-parallel training needs CUDA GPUs, and this machine has none");
}

void check_can_supervise(const TrainConfig& config, int gpus) {
  check_can_run(config);
#ifdef STEPGRAPH_HAVE_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  if (gpus > count)
    throw ConfigError(fmt::format("--gpus {} asks for more GPUs than this machine has ({}); for several machines start "
                                  "one process per GPU with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT "
                                  "(docs/data_parallel.md)",
                                  gpus, count));
#else
  (void)gpus;  // check_can_run refused already: no CUDA
#endif
}

DataParallelGroup join_data_parallel_run(const TrainConfig& config, const RankLaunch& launch,
                                         const std::string& resolved_config) {
  check_can_run(config);
  distributed::RendezvousOptions o;
  o.rank = launch.rank;
  o.world_size = launch.world_size;
  o.master_addr = launch.master_addr;
  o.master_port = launch.master_port;
  o.config_hash = distributed::config_hash(resolved_config);
  o.timeout = std::chrono::milliseconds(static_cast<long long>(launch.timeout_s * 1000));
  DataParallelGroup g;
  g.rank = launch.rank;
  g.world_size = launch.world_size;
  g.local_rank = launch.local_rank;
  g.timeout_s = launch.timeout_s;
#ifdef STEPGRAPH_HAVE_NCCL
  auto joined = distributed::rendezvous_keeping_links(o, launch.rank == 0 ? cuda::new_nccl_unique_id() : std::string());
  g.nccl_id = std::move(joined.payload);
  // From now until this rank's last step, a rank that dies (or an NCCL error)
  // ends every rank with one line instead of leaving them blocked: NCCL setup
  // and a captured all-reduce wait for peers without a timeout of their own.
  distributed::WatchdogOptions watch;
  watch.peer_timeout = std::chrono::milliseconds(static_cast<long long>(launch.peer_timeout_s * 1000));
  watch.report = [](const std::string& line) {
    spdlog::error("{}", line);
    spdlog::default_logger()->flush();
  };
  g.watchdog = std::make_shared<distributed::PeerWatchdog>(std::move(joined.links), std::move(watch));
  spdlog::info("data parallel: rank {} of {} on GPU {} ({}) joined the rendezvous at {}:{} (NCCL {})", g.rank,
               g.world_size, g.local_rank, launch.launcher, o.master_addr, o.master_port, cuda::nccl_version_string());
#endif
  return g;
}

void end_data_parallel_steps(Trainer& trainer, const DataParallelGroup& group, bool completed) {
  if (!group.watchdog) return;
#ifdef STEPGRAPH_HAVE_CUDA
  // The goodbye promises that this rank's last all-reduce has run: wait for the device first.
  if (completed)
    if (auto* cuda_trainer = dynamic_cast<cuda::CudaTrainer*>(&trainer)) cuda_trainer->synchronize();
#else
  (void)trainer;
#endif
  group.watchdog->end(completed);
}

std::unique_ptr<Trainer> make_data_parallel_trainer(const TrainConfig& config, const Dataset& data,
                                                    const DataParallelGroup& group) {
  check_can_run(config);
  check_cuda_can_run(config);
  const auto rows = data.train.images.count;
  if (config.data.batch_size * group.world_size > rows)
    throw ConfigError(fmt::format("{}: data.batch_size {} x {} ranks exceeds the {} training rows", config.source,
                                  config.data.batch_size, group.world_size, rows));
  const auto test_rows = data.test.images.count;
  const DType features = data.train.images.dtype;
  TrainerSpec spec = trainer_spec(config, rows, test_rows, ProgramTarget::cuda, features);
  if (config.model.is_sequential()) {
    SequentialTraining training = sequential_training(config, features);
    training.data_rank = group.rank;
    training.data_ranks = group.world_size;
    spec.program = build_sequential_program(training, rows, test_rows, ProgramTarget::cuda);
  } else {
    MlpTraining training = mlp_training(config, features);
    training.data_rank = group.rank;
    training.data_ranks = group.world_size;
    spec.program = build_mlp_program(training, rows, test_rows, ProgramTarget::cuda);
  }
  spec.data_parallel = group;
  spec.data_parallel.nccl_ctas = static_cast<int>(config.data_parallel.nccl_ctas);
  spec.data_parallel.symmetric_memory = config.data_parallel.symmetric_memory;
#ifdef STEPGRAPH_HAVE_CUDA
  return cuda::make_cuda_trainer(spec, data);
#else
  throw ConfigError("data-parallel training needs the CUDA backend, and this stepgraph was built without CUDA");
#endif
}

io::TensorBlob data_parallel_ranks_blob(int ranks) {
  const std::int32_t v = ranks;
  return {kDataParallelRanksEntry, DType::i32, {1}, std::string(reinterpret_cast<const char*>(&v), sizeof v)};
}

int data_parallel_ranks_of(const std::vector<io::TensorBlob>& tensors) {
  for (const auto& b : tensors)
    if (b.name == kDataParallelRanksEntry && b.dtype == DType::i32 && b.bytes.size() == sizeof(std::int32_t)) {
      std::int32_t v = 0;
      std::memcpy(&v, b.bytes.data(), sizeof v);
      return v;
    }
  return 0;
}

std::vector<io::TensorBlob> without_data_parallel_ranks(std::vector<io::TensorBlob> tensors) {
  std::erase_if(tensors, [](const io::TensorBlob& b) { return b.name == kDataParallelRanksEntry; });
  return tensors;
}

}  // namespace sg::app
