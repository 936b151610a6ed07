#pragma once
// The two kernels behind DgradWgradSgd (dgrad_wgrad.hpp); sizes are checked
// there. Both compute the same thing with the same rounding points.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "ops/cuda/activation.hpp"
#include "ops/cuda/kernels.hpp"

namespace sg::cuda::one_pass {

// The first layer's weight update, folded into the one-pass launch of the
// layer above it (column strips only): the block that completes dX[:, strip]
// (the first layer's output gradient for those units) also applies
//   W_in[strip, :] = (1 - lr*wd) W_in[strip, :] - lr dX[:, strip]^T X_in
// which saves the step its last launch (a cuBLASLt weight-gradient matmul).
struct InputLayerUpdate {
  const __half* x = nullptr;  // [batch, width]: the network's input
  __half* w = nullptr;        // [k, width]: the first layer's weight; null: no update
  const UpdateScalars* scalars = nullptr;
  int width = 0;
};
// Widths the folded update takes (a multiple of 16; its rows and X_in fit shared memory).
constexpr int kMaxInputUpdateWidth = 1024;

// Column strips (dgrad_wgrad_strips.cu): a block owns 16 or 32 columns of W
// and walks all N rows, or a cluster of `splits` blocks shares them where
// one block per strip would leave SMs idle; the warps' dX partials meet in
// shared memory (DSMEM across a cluster), so no workspace. Fastest while W
// is at most ~32 MB (K <= 4096 at N = K).
struct ColumnStripGrid {
  std::int64_t strips = 0;
  int splits = 1;        // blocks (one cluster) per strip
  std::size_t smem = 0;  // dynamic shared memory per block
};
// `splits` 0: the measured rule; else that many (a power of two up to kMaxStripSplits).
// `input_width` > 0: room for a folded first-layer update of that width.
// Sets the smem limit too.
// `activation`: the one whose backward dX goes through (the column-strip
// kernel takes all of activation.hpp's; `saved` is the pre-activation for
// gelu, gelu_tanh and silu, else unused).
ColumnStripGrid plan_column_strips(std::int64_t batch, std::int64_t n, std::int64_t k, int splits = 0,
                                   int input_width = 0, Activation activation = Activation::relu);
void launch_column_strips(const ColumnStripGrid& grid, const __half* dy, const __half* x, std::int64_t batch,
                          std::int64_t n, std::int64_t k, __half* w, __half* dx, const UpdateScalars* scalars,
                          cudaStream_t stream, bool dependent, __half* bias, const UpdateScalars* bias_scalars,
                          const InputLayerUpdate& input, Activation activation = Activation::relu,
                          const __half* saved = nullptr);

// Row ranges (dgrad_wgrad_ranges.cu): a block owns a 128/256-column strip
// and a range of rows, so it reads long contiguous runs of every row; the
// ranges' fp32 dX partials go through a workspace and the last block of a
// strip sums them. Fastest on big W (K = 8192: 112 vs 151 us per layer).
struct RowRangeGrid {
  int columns_per_warp = 0;
  std::int64_t strips = 0, rows_per_range = 0, ranges = 0;
  std::size_t partial_floats = 0;  // workspace: [ranges][batch][k] fp32 partial sums
};
// (sets the smem limit too; `activation`, `saved`: as for the column strips)
RowRangeGrid plan_row_ranges(std::int64_t batch, std::int64_t n, std::int64_t k,
                             Activation activation = Activation::relu);
// `arrivals` ([strips], zero before the first launch) counts finished blocks; the last resets it.
void launch_row_ranges(const RowRangeGrid& grid, const __half* dy, const __half* x, std::int64_t batch, std::int64_t n,
                       std::int64_t k, __half* w, __half* dx, const UpdateScalars* scalars, cudaStream_t stream,
                       bool dependent, __half* bias, const UpdateScalars* bias_scalars, float* partials,
                       unsigned* arrivals, Activation activation = Activation::relu, const __half* saved = nullptr);

// Batch 256 (dgrad_wgrad_wgmma.cu): a block owns 64 columns and all rows of W,
// TMA loads each 64-row tile of W and dY once, one warpgroup accumulates dX
// with wgmma while another computes and applies the update 128 rows at a time.
// Every activation of activation.hpp (`saved`: as for the column strips).
// Needs an sm_90 GPU; empty when it runs these sizes, else why not.
std::string wgmma_unsupported(std::int64_t batch, std::int64_t n, std::int64_t k);
// How many blocks share each dY tile (a cluster, TMA multicast) for K columns:
// with `multicast`, 2 where the 64-column strips pair up, else 1; without, 1.
int wgmma_blocks_sharing_dy(std::int64_t k, bool multicast);
void launch_wgmma(const __half* dy, const __half* x, std::int64_t n, std::int64_t k, __half* w, __half* dx,
                  const UpdateScalars* scalars, cudaStream_t stream, bool multicast, __half* bias,
                  const UpdateScalars* bias_scalars, Activation activation = Activation::relu,
                  const __half* saved = nullptr);

}  // namespace sg::cuda::one_pass
