#include "runtime/cuda/rank_device.hpp"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include "ops/cuda/cuda_check.hpp"

namespace sg::cuda {

int select_device(const DataParallelGroup& dp, const TrainingProgram& p) {
  if (dp.world_size == 0) {
    if (p.train_data.ranks > 1)
      throw CudaError(fmt::format("this program shards its batches over {} ranks but the trainer has no process group",
                                  p.train_data.ranks));
    return -1;
  }
#ifndef STEPGRAPH_HAVE_NCCL
  throw CudaError("data-parallel training needs NCCL, and this stepgraph was built without it (see CMakeLists.txt: "
                  "NCCL_ROOT, or the nvidia-nccl wheel)");
#else
  if (p.train_data.ranks != dp.world_size)
    throw CudaError(fmt::format("the program was built for {} ranks but the process group has {}", p.train_data.ranks,
                                dp.world_size));
  int count = 0;
  SG_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (dp.local_rank < 0 || dp.local_rank >= count)
    throw CudaError(fmt::format("rank {}: local rank {} names no GPU: this machine has {} (start at most {} ranks per "
                                "machine)",
                                dp.rank, dp.local_rank, count, count));
  SG_CUDA_CHECK(cudaSetDevice(dp.local_rank));
  return dp.local_rank;
#endif
}

}  // namespace sg::cuda
