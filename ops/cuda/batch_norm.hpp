#pragma once
// Batch normalisation on the GPU (issue 37), the CPU reference's contract
// (ops/cpu/norm_reference.hpp): x [n, channels, plane] (plane = H*W, or 1),
// per-channel statistics over n * plane values, gamma / beta / running
// statistics [channels]. A cluster of blocks per channel (DSMEM sums), one
// pass for the statistics: the sums of the deviations from one of the
// channel's values and of their squares (a shift that keeps the one-pass
// variance's precision), each a fixed-order sum (the same bits every run, no
// atomics); values moved in packs of up to 16 bytes and, where a channel's
// values fit the cluster's threads' registers (64 bytes per thread and
// tensor), read once: kept from the sums to the output. Per-channel values have
// x's type except the running statistics, which are f32 (as the graph keeps
// them).
//
// x [rows, channels] (plane == 1: BatchNorm1d, or a channels-last [N, H, W,
// C] as its [N*H*W, C] view) of at least kBatchNormRowsMinRows rows, given a
// BatchNormRowsScratch, runs over the whole GPU instead (batch_norm_rows.cu):
// there a channel's values lie `channels` apart, which a block per channel
// would read one value per memory sector.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace sg::cuda {

struct BatchNormShape {
  std::int64_t n = 0, channels = 0, plane = 1;
  float eps = 1e-5f;
  float momentum = 0.1f;
};

// Rows from which plane == 1 takes the whole-GPU path (batch_norm_rows.cu says why this many).
constexpr std::int64_t kBatchNormRowsMinRows = 2048;

// What the whole-GPU path needs beside the tensors. `workspace`: at least
// batch_norm_workspace_bytes(s) bytes whose contents need not survive from
// one launch to the next (the program's shared workspace). `finished`: one
// counter of the launch site's own, 0 before its first launch; every launch
// leaves it 0 (so it cannot live in a workspace that other launches write).
// `dependent_launch`: the first kernel a programmatic dependent of the
// stream's previous one (BackendOptions::dependent_launch). Without a
// workspace or counter the per-channel kernels run whatever the shape.
struct BatchNormRowsScratch {
  void* workspace = nullptr;
  unsigned* finished = nullptr;
  bool dependent_launch = false;
  // Whether it may run as one cooperative launch (x read once) where the
  // device has them; false keeps it to two plain launches (the tests cover both).
  bool cooperative = true;
};

// The workspace bytes the training ops of `s` need: 0 where the per-channel kernels run.
std::size_t batch_norm_workspace_bytes(const BatchNormShape& s);

// Training: y normalised by the batch's statistics; with running_mean and
// running_var (not null) the running statistics' update of
// launch_batch_norm_stats_update in the same launch (the moments once).
// With `residual` (x's shape), y = that + residual (a residual block's add,
// the normalised value rounded to T first, as the graph stores it); with
// `relu`, y = max(that, 0): the add and the ReLU after a batch_norm in its launch.
template <typename T>
void launch_batch_norm_forward(const T* x, const T* gamma, const T* beta, const BatchNormShape& s, T* y,
                               cudaStream_t stream, float* running_mean = nullptr, float* running_var = nullptr,
                               const T* residual = nullptr, bool relu = false, const BatchNormRowsScratch& rows = {});
// (dy, x, gamma) -> dx, dgamma, dbeta, the statistics recomputed; each output
// null when nothing reads it. With dy_other, the gradient is dy + dy_other
// (rounded to T: two branches' gradients added, as in a residual block);
// with relu_out, that is the gradient of a ReLU after the batch_norm and
// relu_out that ReLU's output: the ReLU's backward (the gradient where
// relu_out > 0) in the same launch.
template <typename T>
void launch_batch_norm_backward(const T* dy, const T* x, const T* gamma, const BatchNormShape& s, T* dx, T* dgamma,
                                T* dbeta, cudaStream_t stream, const T* relu_out = nullptr,
                                const T* dy_other = nullptr, const BatchNormRowsScratch& rows = {});
// running_mean / running_var (f32) moved by momentum towards the batch's mean and unbiased variance.
template <typename T>
void launch_batch_norm_stats_update(const T* x, const BatchNormShape& s, float* running_mean, float* running_var,
                                    cudaStream_t stream, const BatchNormRowsScratch& rows = {});
// Eval: y normalised by the running statistics (element-wise, any layout: plane == 1 included).
template <typename T>
void launch_batch_norm_inference(const T* x, const T* gamma, const T* beta, const float* running_mean,
                                 const float* running_var, const BatchNormShape& s, T* y, cudaStream_t stream);

}  // namespace sg::cuda
