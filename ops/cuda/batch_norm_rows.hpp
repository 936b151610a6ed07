#pragma once
// The whole-GPU path of batch normalisation over x [rows, channels]
// (batch_norm_rows.cu): what batch_norm.cu's launchers hand over to it when
// batch_norm_rows_path() says so. Same contracts as batch_norm.hpp's launchers.
#include "ops/cuda/batch_norm.hpp"

namespace sg::cuda {

// plane == 1, at least kBatchNormRowsMinRows rows and the scratch given.
bool batch_norm_rows_path(const BatchNormShape& s, const BatchNormRowsScratch& rows);

// y null: the running statistics alone (launch_batch_norm_rows_stats_update).
template <typename T>
void launch_batch_norm_rows_forward(const T* x, const T* gamma, const T* beta, const BatchNormShape& s, T* y,
                                    cudaStream_t stream, float* running_mean, float* running_var, const T* residual,
                                    bool relu, const BatchNormRowsScratch& rows);
template <typename T>
void launch_batch_norm_rows_backward(const T* dy, const T* x, const T* gamma, const BatchNormShape& s, T* dx, T* dgamma,
                                     T* dbeta, cudaStream_t stream, const T* relu_out, const T* dy_other,
                                     const BatchNormRowsScratch& rows);
template <typename T>
void launch_batch_norm_rows_stats_update(const T* x, const BatchNormShape& s, float* running_mean, float* running_var,
                                         cudaStream_t stream, const BatchNormRowsScratch& rows);

}  // namespace sg::cuda
