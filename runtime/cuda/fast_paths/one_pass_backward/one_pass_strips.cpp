// Lowering: one pass over W for a hidden layer's dgrad and SGD update at
// batch 16/32 below K = 8192: blocks own column strips of W (one cluster per
// strip where it pays), and the launch also takes the first layer's update
// when the options allow (one_pass_pattern.hpp).
#include "runtime/cuda/fast_paths/one_pass_backward/one_pass_pattern.hpp"

namespace sg::cuda {

std::unique_ptr<CudaLowering> make_one_pass_strips_lowering(const BackendOptions& options) {
  return make_one_pass_lowering("one_pass_strips", OnePassKernel::column_strips, options.fold_input_update, /*asks_device=*/false);
}

}  // namespace sg::cuda
