// The CUDA lowerings in priority order: the first whose match takes a unit
// runs it. The core lowerings (this folder) cover every graph on their own;
// each fast path's (runtime/cuda/fast_paths/, one record each) go in at
// their slot: larger patterns first (a whole step, then the fused output
// layer and the one-pass backward, which take several units at once); the
// small dgrads before the forwards, so a forward knows whether a cuBLASLt
// dgrad still needs its ReLU mask; cuBLASLt and the plain kernels take
// whatever is left. With backend.core_only no fast path contributes.
#include "runtime/cuda/lowering.hpp"

#include <algorithm>

#include <fmt/ranges.h>

#include "ops/cuda/cuda_check.hpp"
#include "runtime/cuda/fast_paths/fast_path.hpp"

namespace sg::cuda {

std::unique_ptr<CudaLowering> make_cublaslt_matmul_lowering();
std::unique_ptr<CudaLowering> make_softmax_xent_lowering();
std::unique_ptr<CudaLowering> make_bias_grad_sgd_lowering();
std::unique_ptr<CudaLowering> make_update_multi_tensor_lowering(bool per_bucket, bool large_apart);
std::unique_ptr<CudaLowering> make_grad_clip_scale_lowering();
std::unique_ptr<CudaLowering> make_scale_grad_lowering();
std::unique_ptr<CudaLowering> make_sgd_multi_tensor_lowering(bool per_bucket);
std::unique_ptr<CudaLowering> make_batch_fetch_lowering();
std::unique_ptr<CudaLowering> make_table_fetch_lowering();
std::unique_ptr<CudaLowering> make_elementwise_lowering();
std::unique_ptr<CudaLowering> make_regression_loss_lowering();
std::unique_ptr<CudaLowering> make_softmax_xent_smoothed_lowering();
std::unique_ptr<CudaLowering> make_dropout_lowering();
std::unique_ptr<CudaLowering> make_max_pool2d_lowering();
std::unique_ptr<CudaLowering> make_max_pool2d_backward_lowering();
std::unique_ptr<CudaLowering> make_dropout2d_lowering();
std::unique_ptr<CudaLowering> make_avg_pool2d_lowering();
std::unique_ptr<CudaLowering> make_layer_norm_lowering();
std::unique_ptr<CudaLowering> make_concat_lowering();
std::unique_ptr<CudaLowering> make_augment_lowering();
std::unique_ptr<CudaLowering> make_batch_norm_lowering();
std::unique_ptr<CudaLowering> make_channel_sum_lowering();
std::unique_ptr<CudaLowering> make_view_lowering();
std::unique_ptr<CudaLowering> make_channels_permute_lowering();
std::unique_ptr<CudaLowering> make_column_sum_lowering();
std::unique_ptr<CudaLowering> make_cast_params_lowering();
#ifdef STEPGRAPH_HAVE_CUDNN
std::unique_ptr<CudaLowering> make_conv_cudnn_lowering();
#endif
std::unique_ptr<CudaLowering> make_conv_implicit_gemm_lowering(std::int64_t max_channel_product);
#ifdef STEPGRAPH_HAVE_NCCL
std::unique_ptr<CudaLowering> make_nccl_all_reduce_lowering();  // data parallel (issue 25)
std::unique_ptr<CudaLowering> make_nccl_all_gather_lowering();  // sharded updates (ZeRO-1, issue 38)
#endif

std::vector<std::unique_ptr<CudaLowering>> cuda_lowerings(const BackendOptions& o, bool device_present) {
  std::vector<SlottedLowering> fast;  // every record's lowerings, in record order
  if (!o.core_only)
    for (const FastPath& record : fast_paths())
      for (SlottedLowering& l : record.lowerings(o)) fast.push_back(std::move(l));
  std::vector<std::unique_ptr<CudaLowering>> l;
  const auto slot = [&](FastPathSlot s) {  // the fast paths' lowerings of slot s, here
    for (SlottedLowering& f : fast)
      if (f.slot == s && f.lowering) l.push_back(std::move(f.lowering));
  };
  slot(FastPathSlot::whole_step);
  slot(FastPathSlot::backward_patterns);
  slot(FastPathSlot::dgrad_forward);
  slot(FastPathSlot::hidden_forward);
  slot(FastPathSlot::weight_update);
  l.push_back(make_cublaslt_matmul_lowering());
  l.push_back(make_softmax_xent_lowering());
  // A bias gradient's fusion group (reduce_rows + its SGD update) in one kernel:
  // core, since the fusion pass forms the group for every SGD graph.
  // A channels-last conv's bias gradient: the column sums of a tall
  // [N*H*W, C] (with its SGD update), before the kernels made for a batch of rows.
  l.push_back(make_column_sum_lowering());
  l.push_back(make_bias_grad_sgd_lowering());
  slot(FastPathSlot::bias_update);
  // The update stage (issue 35): every update-rule node left (Adam, AdamW, RMSprop) in one launch; clipping.
  l.push_back(make_update_multi_tensor_lowering(o.update_per_bucket, o.large_updates_apart));
  l.push_back(make_grad_clip_scale_lowering());
  l.push_back(make_scale_grad_lowering());
  l.push_back(make_batch_fetch_lowering());
  l.push_back(make_table_fetch_lowering());  // float features/targets, features-only fetches (issue 23)
  l.push_back(make_regression_loss_lowering());
  l.push_back(make_softmax_xent_smoothed_lowering());
  l.push_back(make_dropout_lowering());
  // CNN kernels (issue 22): max-pool with the dropout2d / relu around it
  // (forward and backward chains), a lone dropout2d, the conv bias gradient.
  // They take only CNN nodes: MLP schedules do not change.
  l.push_back(make_max_pool2d_lowering());
  l.push_back(make_max_pool2d_backward_lowering());
  l.push_back(make_dropout2d_lowering());
  l.push_back(make_avg_pool2d_lowering());  // mean pooling, global pooling (issue 37)
  l.push_back(make_layer_norm_lowering());  // layer_norm and its backward (issue 37)
  l.push_back(make_concat_lowering());      // concat and slice_channels, its gradient (issue 37)
  l.push_back(make_augment_lowering());     // training-batch augmentation (issue 37)
  l.push_back(make_batch_norm_lowering());  // batch normalisation's four ops (issue 37)
  slot(FastPathSlot::cnn_bias_update);
  l.push_back(make_channel_sum_lowering());
  // Every SGD update the fused ones above left (any parameter, Nesterov too) in one launch.
  l.push_back(make_sgd_multi_tensor_lowering(o.update_per_bucket));
  // Reshape/flatten as views; fp32 master weights' casts left: one launch for all.
  l.push_back(make_view_lowering());
  l.push_back(make_channels_permute_lowering());  // NCHW <-> channels-last where it moves data
  l.push_back(make_cast_params_lowering());
  // Convolutions: backend.conv_kernels first (implicit_gemm: ours for all;
  // auto: the our_conv fast path where it measured faster), then cuDNN, then
  // ours for whatever cuDNN refuses or where it is missing.
  if (o.conv_kernels == ConvKernels::implicit_gemm) l.push_back(make_conv_implicit_gemm_lowering(0));
  slot(FastPathSlot::convolution);
#ifdef STEPGRAPH_HAVE_CUDNN
  l.push_back(make_conv_cudnn_lowering());
#endif
  if (o.conv_kernels != ConvKernels::implicit_gemm) l.push_back(make_conv_implicit_gemm_lowering(0));
#ifdef STEPGRAPH_HAVE_NCCL
  l.push_back(make_nccl_all_reduce_lowering());  // a gradient bucket's all_reduce_mean (issue 25)
  l.push_back(make_nccl_all_gather_lowering());  // a sharded parameter's all_gather_shards (issue 38)
#endif

  l.push_back(make_elementwise_lowering());
  for (const SlottedLowering& f : fast)
    if (f.lowering) throw CudaError(fmt::format("fast path lowering {} has no slot in cuda_lowerings()", f.lowering->name()));
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
