#include "runtime/backend_options.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "ops/cuda/kernel_limits.hpp"

namespace sg {

std::string_view whole_step_mode_name(WholeStepMode mode) {
  switch (mode) {
    case WholeStepMode::automatic: return "auto";
    case WholeStepMode::grid: return "grid";
    case WholeStepMode::cluster: return "cluster";
    case WholeStepMode::resident: return "resident";
  }
  throw std::invalid_argument("whole_step_mode_name: not a WholeStepMode");
}

WholeStepMode whole_step_mode_from_name(std::string_view name) {
  for (WholeStepMode mode : {WholeStepMode::automatic, WholeStepMode::grid, WholeStepMode::cluster,
                             WholeStepMode::resident})
    if (whole_step_mode_name(mode) == name) return mode;
  throw std::invalid_argument("whole step mode '" + std::string(name) + "' is not one of auto, grid, cluster, resident");
}

std::string_view conv_kernels_name(ConvKernels kernels) {
  switch (kernels) {
    case ConvKernels::automatic: return "auto";
    case ConvKernels::cudnn: return "cudnn";
    case ConvKernels::implicit_gemm: return "implicit_gemm";
    case ConvKernels::tensor_core: return "tensor_core";
  }
  throw std::invalid_argument("conv_kernels_name: not a ConvKernels");
}

ConvKernels conv_kernels_from_name(std::string_view name) {
  for (ConvKernels k : {ConvKernels::automatic, ConvKernels::cudnn, ConvKernels::implicit_gemm, ConvKernels::tensor_core})
    if (conv_kernels_name(k) == name) return k;
  throw std::invalid_argument("conv kernels '" + std::string(name) + "' is not one of auto, cudnn, implicit_gemm, tensor_core");
}

std::string_view activation_layout_name(ActivationLayout layout) {
  switch (layout) {
    case ActivationLayout::automatic: return "auto";
    case ActivationLayout::nchw: return "nchw";
    case ActivationLayout::channels_last: return "channels_last";
  }
  throw std::invalid_argument("activation_layout_name: not an ActivationLayout");
}

ActivationLayout activation_layout_from_name(std::string_view name) {
  for (ActivationLayout l : {ActivationLayout::automatic, ActivationLayout::nchw, ActivationLayout::channels_last})
    if (activation_layout_name(l) == name) return l;
  throw std::invalid_argument("activation layout '" + std::string(name) + "' is not one of auto, nchw, channels_last");
}

std::string strip_splits_problem(std::int64_t splits) {
  if (splits == 0) return {};
  if (splits < 1 || splits > cuda::kMaxStripSplits || (splits & (splits - 1)) != 0)
    return "must be 0 (the measured rule) or a power of two up to " + std::to_string(cuda::kMaxStripSplits) +
           " (got " + std::to_string(splits) + ")";
  return {};
}

std::string resident_cluster_problem(std::int64_t cluster) {
  if (cluster == 0) return {};
  const auto& sizes = cuda::kResidentClusterSizes;
  if (std::find(sizes.begin(), sizes.end(), cluster) != sizes.end()) return {};
  std::string allowed;
  for (int s : sizes) allowed += (allowed.empty() ? "" : ", ") + std::to_string(s);
  return "must be 0 (the largest that fits) or one of " + allowed + " (got " + std::to_string(cluster) + ")";
}

}  // namespace sg
