#include "runtime/cuda/fast_paths/fast_path.hpp"

namespace sg::cuda {

// One function per record, in its folder (<name>/<name>_record.cpp).
FastPath whole_step_fast_path();
FastPath one_pass_backward_fast_path();
FastPath classifier_head_fast_path();
FastPath small_forward_dgrad_fast_path();
FastPath small_batch_forward_fast_path();
FastPath fused_update_fast_path();
FastPath few_channel_conv_fast_path();
FastPath our_conv_fast_path();
FastPath tensor_core_conv_fast_path();

const std::vector<FastPath>& fast_paths() {
  static const std::vector<FastPath> records = {
      whole_step_fast_path(),          one_pass_backward_fast_path(),   classifier_head_fast_path(),
      small_forward_dgrad_fast_path(), small_batch_forward_fast_path(), fused_update_fast_path(),
      few_channel_conv_fast_path(),    our_conv_fast_path(),            tensor_core_conv_fast_path()};
  return records;
}

}  // namespace sg::cuda
