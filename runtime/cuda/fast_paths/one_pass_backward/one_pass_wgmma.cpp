// Lowering: one pass over W for a hidden layer's dgrad and SGD update at
// batch 256 from K = 8192, on Hopper's wgmma with TMA loads
// (one_pass_pattern.hpp). Asks the device: the kernel needs sm_90.
#include "runtime/cuda/fast_paths/one_pass_backward/one_pass_pattern.hpp"

namespace sg::cuda {

std::unique_ptr<CudaLowering> make_one_pass_wgmma_lowering(const BackendOptions&) {
  return make_one_pass_lowering("one_pass_wgmma", OnePassKernel::wgmma, false, /*asks_device=*/true);
}

}  // namespace sg::cuda
