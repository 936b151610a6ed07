// Lowering: one pass over W for a hidden layer's dgrad and SGD update at
// batch 16/32 from K = 8192: the blocks of a column strip each own a range of
// W's rows and sum their dX partials in range order (one_pass_pattern.hpp).
#include "runtime/cuda/fast_paths/one_pass_backward/one_pass_pattern.hpp"

namespace sg::cuda {

std::unique_ptr<CudaLowering> make_one_pass_row_ranges_lowering(const BackendOptions&) {
  return make_one_pass_lowering("one_pass_row_ranges", OnePassKernel::row_ranges, false, /*asks_device=*/false);
}

}  // namespace sg::cuda
