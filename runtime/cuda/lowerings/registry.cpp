// The CUDA lowerings in priority order: the first whose match takes a unit
// runs it. Larger patterns come first (a whole step, then the fused output
// layer and the one-pass backward, which take several units at once); the
// dgrad lowerings come before the forwards, so a forward knows whether a
// cuBLASLt dgrad still needs its ReLU mask; cuBLASLt and the plain kernels
// take whatever is left.
#include "runtime/cuda/lowering.hpp"

#include <algorithm>

#include <fmt/ranges.h>

#include "ops/cuda/cuda_check.hpp"

namespace sg::cuda {

std::unique_ptr<CudaLowering> make_cnn_step_lowering(const BackendOptions&);
std::unique_ptr<CudaLowering> make_resident_step_lowering(const BackendOptions&);
std::unique_ptr<CudaLowering> make_whole_step_lowering(const BackendOptions&);
std::unique_ptr<CudaLowering> make_output_layer_backward_lowering();
std::unique_ptr<CudaLowering> make_one_pass_wgmma_lowering(const BackendOptions&);
std::unique_ptr<CudaLowering> make_one_pass_row_ranges_lowering(const BackendOptions&);
std::unique_ptr<CudaLowering> make_one_pass_strips_lowering(const BackendOptions&);
std::unique_ptr<CudaLowering> make_small_k_dgrad_relu_lowering();
std::unique_ptr<CudaLowering> make_small_n_forward_lowering(const BackendOptions&);
std::unique_ptr<CudaLowering> make_small_batch_forward_lowering();
std::unique_ptr<CudaLowering> make_small_m_wgrad_sgd_lowering(const BackendOptions&);
std::unique_ptr<CudaLowering> make_wgrad_adam_lowering(const BackendOptions&);
std::unique_ptr<CudaLowering> make_cublaslt_matmul_lowering();
std::unique_ptr<CudaLowering> make_softmax_xent_lowering();
std::unique_ptr<CudaLowering> make_bias_grad_sgd_lowering();
std::unique_ptr<CudaLowering> make_bias_grad_adam_lowering();
std::unique_ptr<CudaLowering> make_adam_multi_tensor_lowering();
std::unique_ptr<CudaLowering> make_grad_clip_scale_lowering();
std::unique_ptr<CudaLowering> make_scale_grad_lowering();
std::unique_ptr<CudaLowering> make_sgd_nesterov_lowering();
std::unique_ptr<CudaLowering> make_batch_fetch_lowering();
std::unique_ptr<CudaLowering> make_table_fetch_lowering();
std::unique_ptr<CudaLowering> make_elementwise_lowering();
std::unique_ptr<CudaLowering> make_regression_loss_lowering();
std::unique_ptr<CudaLowering> make_softmax_xent_smoothed_lowering();
std::unique_ptr<CudaLowering> make_dropout_lowering();
std::unique_ptr<CudaLowering> make_max_pool2d_lowering();
std::unique_ptr<CudaLowering> make_max_pool2d_backward_lowering();
std::unique_ptr<CudaLowering> make_dropout2d_lowering();
std::unique_ptr<CudaLowering> make_channel_sum_sgd_lowering();
std::unique_ptr<CudaLowering> make_channel_sum_lowering();
std::unique_ptr<CudaLowering> make_conv_weight_sgd_lowering();
std::unique_ptr<CudaLowering> make_view_lowering();
std::unique_ptr<CudaLowering> make_cast_params_lowering();
#ifdef STEPGRAPH_HAVE_CUDNN
std::unique_ptr<CudaLowering> make_conv_cudnn_lowering();
#endif
std::unique_ptr<CudaLowering> make_conv_implicit_gemm_lowering(std::int64_t max_channel_product);
#ifdef STEPGRAPH_HAVE_NCCL
std::unique_ptr<CudaLowering> make_nccl_all_reduce_lowering();  // data parallel (issue 25)
#endif

std::vector<std::unique_ptr<CudaLowering>> cuda_lowerings(const BackendOptions& o, bool device_present) {
  // Our fused kernels accumulate in fp32, as cuBLASLt does by default.
  const bool ours = o.one_pass_backward && !o.accumulate_f16;
  std::vector<std::unique_ptr<CudaLowering>> l;
  if (o.whole_step) {
    l.push_back(make_cnn_step_lowering(o));  // a small CNN's whole step (issue 22)
    l.push_back(make_resident_step_lowering(o));
    l.push_back(make_whole_step_lowering(o));
  }
  if (ours) {
    l.push_back(make_output_layer_backward_lowering());
    l.push_back(make_one_pass_wgmma_lowering(o));
    l.push_back(make_one_pass_row_ranges_lowering(o));
    l.push_back(make_one_pass_strips_lowering(o));
  }
  l.push_back(make_small_k_dgrad_relu_lowering());
  l.push_back(make_small_n_forward_lowering(o));
  if (ours && o.small_batch_forward) l.push_back(make_small_batch_forward_lowering());
  l.push_back(make_small_m_wgrad_sgd_lowering(o));
  // A weight gradient's tile straight into its Adam/AdamW update (issue 21), before cuBLASLt takes the
  // matmul; one of our fused weight updates (backend.one_pass_backward: false keeps cuBLASLt's and a buffer).
  if (ours) l.push_back(make_wgrad_adam_lowering(o));
  l.push_back(make_cublaslt_matmul_lowering());
  l.push_back(make_softmax_xent_lowering());
  l.push_back(make_bias_grad_sgd_lowering());
  // Adam/AdamW, clipping, Nesterov (issue 21): the bias updates fused with
  // their column sums first, then every other Adam update in one launch.
  l.push_back(make_bias_grad_adam_lowering());
  l.push_back(make_adam_multi_tensor_lowering());
  l.push_back(make_grad_clip_scale_lowering());
  l.push_back(make_scale_grad_lowering());
  l.push_back(make_sgd_nesterov_lowering());
  l.push_back(make_batch_fetch_lowering());
  l.push_back(make_table_fetch_lowering());  // float features/targets, features-only fetches (issue 23)
  l.push_back(make_regression_loss_lowering());
  l.push_back(make_softmax_xent_smoothed_lowering());
  l.push_back(make_dropout_lowering());
  // CNN kernels of our own (issue 22): max-pool with the dropout2d / relu
  // around it (forward and backward chains), a lone dropout2d, the conv bias
  // gradient [+ its SGD update], and the conv weights' SGD updates in one
  // launch. They take only CNN nodes (pooling, dropout2d, channel_sum, rank-4
  // parameters): MLP schedules do not change.
  l.push_back(make_max_pool2d_lowering());
  l.push_back(make_max_pool2d_backward_lowering());
  l.push_back(make_dropout2d_lowering());
  l.push_back(make_channel_sum_sgd_lowering());
  l.push_back(make_channel_sum_lowering());
  l.push_back(make_conv_weight_sgd_lowering());
  // Convolutional networks (issue 22): reshape/flatten as views, the
  // convolutions by cuDNN (a conv takes the relu right after it first).
  l.push_back(make_view_lowering());
  l.push_back(make_cast_params_lowering());  // fp32 master weights' casts left: one launch for all
  // Convolutions: backend.conv_kernels first, the other for what it refuses.
  // auto: ours where input x output channels <= 256, measured faster than
  // cuDNN's best engine there on the H100 (the report CNN's 1->10 and 10->20
  // layers at batch 64 and 256, the fast config's 1->32) and far slower at
  // 32->64 (docs/benchmarks.md, "CNN").
  constexpr std::int64_t kOursMaxChannelProduct = 256;
  if (o.conv_kernels == ConvKernels::implicit_gemm) l.push_back(make_conv_implicit_gemm_lowering(0));
  if (o.conv_kernels == ConvKernels::automatic) l.push_back(make_conv_implicit_gemm_lowering(kOursMaxChannelProduct));
#ifdef STEPGRAPH_HAVE_CUDNN
  l.push_back(make_conv_cudnn_lowering());
#endif
  if (o.conv_kernels != ConvKernels::implicit_gemm) l.push_back(make_conv_implicit_gemm_lowering(0));
#ifdef STEPGRAPH_HAVE_NCCL
  l.push_back(make_nccl_all_reduce_lowering());  // a gradient bucket's all_reduce_mean (issue 25)
#endif

  l.push_back(make_elementwise_lowering());
  if (!device_present)
    l.erase(std::remove_if(l.begin(), l.end(), [](const auto& x) { return x->asks_device(); }), l.end());
  return l;
}

std::vector<const Lowering*> as_lowerings(const std::vector<std::unique_ptr<CudaLowering>>& lowerings) {
  std::vector<const Lowering*> out;
  for (const auto& l : lowerings) out.push_back(l.get());
  return out;
}

const CudaLowering& cuda_lowering_of(const Launch& launch) {
  const auto* l = dynamic_cast<const CudaLowering*>(launch.lowering);
  if (!l) throw CudaError("a launch scheduled by a lowering of another backend");
  return *l;
}

}  // namespace sg::cuda
