#pragma once
// One layer's backward in ONE pass over its weights, for a small batch (or
// batch 256 on big W, with wgmma): for
// W[N,K], the gradient dY[B,N] of the layer's pre-activation and its input
// X[B,K] (an activation's output: X = act(Z)),
//   dX = act'(dY W)                          (the previous layer's gradient;
//                                             for ReLU (dY W) * (X > 0))
//   W  = (1 - lr*wd) W - lr dY^T X           (plain SGD, in place)
// cuBLASLt needs two passes (a dgrad reading W, then a weight-gradient
// matmul reading and writing it); with a batch of 32 both are bound by
// memory traffic, so one pass saves a third of it. Tensor cores (wmma or mma.sync),
// fp32 accumulation, fp16 results rounded once, as the cuBLASLt calls round.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "ops/cuda/cuda_resources.hpp"
#include "ops/cuda/fast_paths/one_pass_backward/dgrad_wgrad_kernels.hpp"
#include "ops/cuda/kernel_limits.hpp"
#include "ops/cuda/kernels.hpp"

namespace sg::cuda {

// How DgradWgradSgd plans and launches (BackendOptions' one-pass knobs).
struct DgradWgradOptions {
  // Column-strip kernel: blocks per strip, a power of two up to
  // kMaxStripSplits (Hopper); 0: the measured rule.
  int strip_splits = 0;
  // Batch-256 wgmma kernel: pairs of blocks share each dY tile (cluster of 2,
  // TMA multicast) where the strips pair up; off: one copy per block.
  bool multicast = true;
  // Column-strip and row-range kernels: dependent launch (dependent_launch.cuh).
  bool dependent = true;
};

// Empty when the kernel runs these sizes, else why not.
std::string dgrad_wgrad_unsupported(std::int64_t batch, std::int64_t n, std::int64_t k);

// Which of the one-pass kernels runs a (batch, N, K) that dgrad_wgrad_unsupported
// accepts: column strips (batch 16/32), row ranges (batch 16/32 from K = 8192),
// or wgmma (batch 256).
enum class OnePassKernel : std::uint8_t { column_strips, row_ranges, wgmma };
OnePassKernel one_pass_kernel_for(std::int64_t batch, std::int64_t k);
// (Each of them takes dX through any activation of activation.hpp.)
// Empty when a launch for these sizes can also take the first layer's update
// (one_pass::InputLayerUpdate) for an input of `input_width` columns.
std::string input_update_unsupported(std::int64_t batch, std::int64_t n, std::int64_t k, std::int64_t input_width);

// The one-pass kernel for one (batch, N, K). For big W (K >= 8192) the
// blocks that share a strip of columns each own a range of W's rows, write
// fp32 dX partial sums to a workspace this object owns, and the last to
// finish sums them in range order (deterministic). Construct outside stream
// capture; launches are capturable and must not run concurrently with each
// other.
class DgradWgradSgd {
 public:
  // options: see DgradWgradOptions. input_width > 0: launches take the first
  // layer's update for an input that wide (see input_update_unsupported).
  // activation: the one X came out of.
  DgradWgradSgd(std::int64_t batch, std::int64_t n, std::int64_t k, const DgradWgradOptions& options = {},
                std::int64_t input_width = 0, Activation activation = Activation::relu);

  // With bias set, the launch also applies SGD to the previous layer's bias
  // from the column sums of dx (its gradient): b = (1 - lr*wd) b - lr colsum(dx).
  // With input.w set (and input.width the constructor's input_width), it
  // also updates the first layer's weight from dx (one_pass::InputLayerUpdate);
  // then dx may be null (nothing else reads it). pre_activation: Z, for an
  // activation whose backward reads it (gelu, gelu_tanh, silu).
  void launch(const __half* dy, const __half* x, __half* w, __half* dx, const UpdateScalars* scalars,
              cudaStream_t stream, __half* bias = nullptr, const UpdateScalars* bias_scalars = nullptr,
              const one_pass::InputLayerUpdate& input = {}, const __half* pre_activation = nullptr) const;

  // Whether the batch-256 wgmma kernel runs these sizes.
  bool wgmma() const { return batch_ == 256; }
  // Row ranges per column strip; 0 when the column-strip or wgmma kernel runs these sizes.
  std::int64_t row_ranges() const { return grid_.ranges; }
  // Blocks sharing each column strip (column-strip kernel; 1 otherwise).
  int strip_splits() const { return strips_.splits; }

 private:
  std::int64_t batch_, n_, k_, input_width_;
  Activation activation_;
  DgradWgradOptions options_;
  one_pass::ColumnStripGrid strips_;
  one_pass::RowRangeGrid grid_;
  DeviceBuffer partials_;
  DeviceBuffer arrivals_;
};

}  // namespace sg::cuda
