// Lowering: a graph that is exactly a small MLP's training step (plain SGD,
// fp16) as ONE thread-block cluster that keeps the weights in shared memory
// across the K steps of a launch (ops/cuda/fast_paths/whole_step/resident_step.cu): it pays where
// a launch runs several steps. Asks the device (clusters, shared memory).
#include "runtime/cuda/fast_paths/whole_step/whole_step_support.hpp"

namespace sg::cuda {

std::unique_ptr<CudaLowering> make_resident_step_lowering(const BackendOptions& options) {
  return make_whole_graph_lowering("resident_step", options, /*resident=*/true);
}

}  // namespace sg::cuda
