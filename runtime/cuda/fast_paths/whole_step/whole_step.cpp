// Lowering: a graph that is exactly a small MLP's training step (plain SGD,
// fp16) as ONE kernel per step (ops/cuda/fast_paths/whole_step/whole_step.cu): a cooperative grid
// with grid barriers between its phases, or one thread-block cluster.
// Asks the device (shared memory per block, compute capability).
#include "runtime/cuda/fast_paths/whole_step/whole_step_support.hpp"

namespace sg::cuda {

std::unique_ptr<CudaLowering> make_whole_step_lowering(const BackendOptions& options) {
  return make_whole_graph_lowering("whole_step", options, /*resident=*/false);
}

}  // namespace sg::cuda
