// DgradWgradSgd: checks sizes, picks the kernel variant for the size of W
// (dgrad_wgrad_kernels.hpp), owns the row-range variant's workspace.
#include <fmt/format.h>

#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/fast_paths/measured_costs.hpp"
#include "ops/cuda/fast_paths/one_pass_backward/dgrad_wgrad.hpp"

namespace sg::cuda {
namespace {

// Where each variant pays: measured rules (ops/cuda/fast_paths/measured_costs.hpp).
constexpr std::int64_t kRowRangesFromK = measured::kOnePassRowRangesFromK;
constexpr std::int64_t kWgmmaFromK = measured::kOnePassWgmmaFromK;

}  // namespace

std::string dgrad_wgrad_unsupported(std::int64_t batch, std::int64_t n, std::int64_t k) {
  if (batch == 256) {
    if (k < kWgmmaFromK)
      return fmt::format("batch 256 with K = {}: below K = {} two cuBLASLt passes are faster", k, kWgmmaFromK);
    return one_pass::wgmma_unsupported(batch, n, k);
  }
  if (batch != 16 && batch != 32) return fmt::format("batch {} (16, 32, or 256 from K = {})", batch, kWgmmaFromK);
  if (n % 16 != 0 || k % 16 != 0 || n <= 0 || k <= 0)
    return fmt::format("weight [{},{}] is not a multiple of 16 both ways", n, k);
  if (n > (std::int64_t(1) << 30) || k > (std::int64_t(1) << 30)) return "weight too large";
  return {};
}

OnePassKernel one_pass_kernel_for(std::int64_t batch, std::int64_t k) {
  if (batch == 256) return OnePassKernel::wgmma;
  return k < kRowRangesFromK ? OnePassKernel::column_strips : OnePassKernel::row_ranges;
}

std::string input_update_unsupported(std::int64_t batch, std::int64_t n, std::int64_t k, std::int64_t input_width) {
  if (std::string why = dgrad_wgrad_unsupported(batch, n, k); !why.empty()) return why;
  if (batch != 16 && batch != 32) return fmt::format("batch {}: the folded update runs at batch 16 and 32", batch);
  if (k >= kRowRangesFromK) return fmt::format("K = {}: the row-range kernel takes it, without the input update", k);
  if (input_width <= 0 || input_width % 16 != 0 || input_width > one_pass::kMaxInputUpdateWidth)
    return fmt::format("input width {} (a multiple of 16 up to {})", input_width, one_pass::kMaxInputUpdateWidth);
  return {};
}

DgradWgradSgd::DgradWgradSgd(std::int64_t batch, std::int64_t n, std::int64_t k, const DgradWgradOptions& options,
                             std::int64_t input_width, Activation activation)
    : batch_(batch), n_(n), k_(k), input_width_(input_width), activation_(activation), options_(options) {
  if (const std::string why = dgrad_wgrad_unsupported(batch, n, k); !why.empty())
    throw CudaError("one-pass dgrad+SGD: unsupported: " + why);
  if (input_width > 0)
    if (const std::string why = input_update_unsupported(batch, n, k, input_width); !why.empty())
      throw CudaError("one-pass dgrad+SGD: no folded input update: " + why);
  if (batch == 256) return;  // the wgmma kernel: nothing to plan, no workspace
  if (k < kRowRangesFromK) {
    strips_ = one_pass::plan_column_strips(batch, n, k, options.strip_splits, int(input_width), activation);
    return;
  }
  grid_ = one_pass::plan_row_ranges(batch, n, k, activation);
  partials_ = DeviceBuffer(grid_.partial_floats * sizeof(float));
  arrivals_ = DeviceBuffer(std::size_t(grid_.strips) * sizeof(unsigned));
  arrivals_.fill_bytes(0);
}

void DgradWgradSgd::launch(const __half* dy, const __half* x, __half* w, __half* dx, const UpdateScalars* scalars,
                           cudaStream_t stream, __half* bias, const UpdateScalars* bias_scalars,
                           const one_pass::InputLayerUpdate& input, const __half* pre_activation) const {
  if (input.w && (input.width != input_width_ || !input.x || !input.scalars))
    throw CudaError(fmt::format("one-pass dgrad+SGD: input update of width {} (planned for {}) or without X/scalars",
                                input.width, input_width_));
  if (!dx && !input.w) throw CudaError("one-pass dgrad+SGD: dX has nowhere to go");
  if (batch_ == 256) {
    if (!dx || input.w) throw CudaError("one-pass dgrad+SGD (wgmma): needs dX and takes no input-layer update");
    one_pass::launch_wgmma(dy, x, n_, k_, w, dx, scalars, stream, options_.multicast, bias, bias_scalars, activation_,
                           pre_activation);
  } else if (grid_.ranges == 0)
    one_pass::launch_column_strips(strips_, dy, x, batch_, n_, k_, w, dx, scalars, stream, options_.dependent, bias,
                                   bias_scalars, input, activation_, pre_activation);
  else
    one_pass::launch_row_ranges(grid_, dy, x, batch_, n_, k_, w, dx, scalars, stream, options_.dependent, bias,
                                bias_scalars, partials_.as<float>(), arrivals_.as<unsigned>(), activation_, pre_activation);
}

}  // namespace sg::cuda
