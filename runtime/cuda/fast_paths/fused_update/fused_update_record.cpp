// Fast path fused_update: a gradient's producer fused with its optimizer
// update so the gradient never reaches memory: the classifier's weight
// gradient with SGD (small_m_wgrad_sgd), a weight gradient's tile straight
// into its update rule's step (wgrad_update: Adam, AdamW, RMSprop..., with the
// one-pass backward's options), bias column sums into the rule's step
// (bias_grad_update; with SGD they are a fusion group the core's bias_grad_sgd runs)
// and conv bias channel sums with SGD (channel_sum_sgd). The SGD updates left
// run in the core's one multi-tensor launch (sgd_multi_tensor).
#include "runtime/cuda/fast_paths/fast_path.hpp"
#include "runtime/cuda/fast_paths/why_not_support.hpp"
#include "runtime/cuda/lowerings/update_rule_table.hpp"

namespace sg::cuda {

std::unique_ptr<CudaLowering> make_small_m_wgrad_sgd_lowering(const BackendOptions&);
std::unique_ptr<CudaLowering> make_wgrad_update_lowering(const BackendOptions&);
std::unique_ptr<CudaLowering> make_bias_grad_update_lowering();
std::unique_ptr<CudaLowering> make_channel_sum_sgd_lowering();

namespace {

std::vector<SlottedLowering> fused_update_lowerings(const BackendOptions& o) {
  std::vector<SlottedLowering> l;
  l.push_back({FastPathSlot::weight_update, make_small_m_wgrad_sgd_lowering(o)});
  // Issue 21; one of our fused weight updates (backend.one_pass_backward: false keeps cuBLASLt's and a buffer).
  if (o.one_pass_backward && !o.accumulate_f16) l.push_back({FastPathSlot::weight_update, make_wgrad_update_lowering(o)});
  l.push_back({FastPathSlot::bias_update, make_bias_grad_update_lowering()});
  l.push_back({FastPathSlot::cnn_bias_update, make_channel_sum_sgd_lowering()});
  return l;
}

std::string fused_update_why_not(const sg::Graph& g, const BackendOptions& /*o*/, bool /*device_present*/) {
  bool updates = false;
  for (const Node& n : g.nodes()) updates = updates || n.op == OpKind::sgd_update || is_update_rule_op(n.op);
  if (!updates) {
    const std::string other = not_plain_sgd(g);
    return other.empty() ? "the graph updates no parameter" : other.substr(0, other.find(':')) + ": no fused kernel for it";
  }
  return {};  // the shapes and dtypes decide: declined_fast_paths says when none fits
}

}  // namespace

FastPath fused_update_fast_path() {
  return {"fused_update",
          "gradients fused with their update (SGD, or any update rule: Adam, AdamW, RMSprop) (classifier weights, Adam biases, conv channel sums)",
          {},
          fused_update_lowerings,
          fused_update_why_not};
}

}  // namespace sg::cuda
