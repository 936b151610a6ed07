#pragma once
// One rank of a data-parallel training run (issue 25): joining the run (the
// rendezvous hands out rank 0's NCCL id after checking that every rank has
// the same world size and resolved config), the rank's CUDA trainer (the
// config's model, model.layers or model.sequential, built for its slice of
// each global batch, with the gradient all-reduce), and the checkpoint entry
// that records the rank count so a run resumes at the same one.
// docs/data_parallel.md.
#include <memory>
#include <string>
#include <vector>

#include "apps/config/train_config.hpp"
#include "apps/rank_launch.hpp"
#include "runtime/trainer.hpp"

namespace sg::app {

// Throws ConfigError when the config cannot run data parallel (CPU backend,
// no NCCL or no GPU in this build/machine).
void check_can_run(const TrainConfig& config);
// check_can_run, and `gpus` ranks fit this machine's GPUs (--gpus N).
void check_can_supervise(const TrainConfig& config, int gpus);

// check_can_run, then the rendezvous: throws distributed::RendezvousError
// (one line) when the ranks disagree or one does not come.
DataParallelGroup join_data_parallel_run(const TrainConfig& config, const RankLaunch& launch,
                                         const std::string& resolved_config);

// This rank has run its last training step (`completed`) or stops early:
// its peer watchdog stops (what follows, evaluation and outputs, has no
// collective) and, only when completed, first tells every peer goodbye, so
// its exit is not taken for a death. A rank that stops early closes its
// connections without one, and every rank still in its steps ends too.
void end_data_parallel_steps(Trainer& trainer, const DataParallelGroup& group, bool completed);

// The CUDA trainer of this rank: trainer_spec's, with the program rebuilt for
// rank `group.rank` of `group.world_size`.
std::unique_ptr<Trainer> make_data_parallel_trainer(const TrainConfig& config, const Dataset& data,
                                                    const DataParallelGroup& group);

// Checkpoint entry i32 [1]: the ranks of the data-parallel run that wrote it
// (absent: a single-process run). Its dot keeps it apart from graph values.
inline constexpr const char* kDataParallelRanksEntry = "data.parallel_ranks";
io::TensorBlob data_parallel_ranks_blob(int ranks);
// The entry's value (0 when absent), and the tensors without it.
int data_parallel_ranks_of(const std::vector<io::TensorBlob>& tensors);
std::vector<io::TensorBlob> without_data_parallel_ranks(std::vector<io::TensorBlob> tensors);

}  // namespace sg::app
