#pragma once
// The defaults of the data-parallel tuning that both the config
// (apps/config/train_config.hpp: data_parallel.*) and the runtime's process
// group (runtime/trainer.hpp: DataParallelGroup) carry: one place, so a run
// built without a config file gets what a config without the keys gets.
namespace sg::data_parallel_defaults {

// NCCL's CTAs per collective, fixed (ncclConfig_t minCTAs = maxCTAs); 32 is
// what NCCL's symmetric kernels need (docs/data_parallel.md measures 16/32/64).
inline constexpr int kNcclCtas = 32;
// The training program's arena in one registered NCCL window, so the
// buckets run NCCL's symmetric kernels.
inline constexpr bool kSymmetricMemory = true;

}  // namespace sg::data_parallel_defaults
