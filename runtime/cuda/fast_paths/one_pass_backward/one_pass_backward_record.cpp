// Fast path one_pass_backward: the output layer's backward (softmax-xent
// gradient, dgrad, bias and weight SGD) as one kernel, and a hidden layer's
// dgrad with its weight's SGD update in one pass over W (column strips, row
// ranges, or wgmma at batch 256), the first layer's update folded in.
#include "runtime/cuda/fast_paths/fast_path.hpp"
#include "runtime/cuda/fast_paths/why_not_support.hpp"

namespace sg::cuda {

std::unique_ptr<CudaLowering> make_output_layer_backward_lowering();
std::unique_ptr<CudaLowering> make_one_pass_wgmma_lowering(const BackendOptions&);
std::unique_ptr<CudaLowering> make_one_pass_row_ranges_lowering(const BackendOptions&);
std::unique_ptr<CudaLowering> make_one_pass_strips_lowering(const BackendOptions&);

namespace {

std::vector<SlottedLowering> one_pass_lowerings(const BackendOptions& o) {
  std::vector<SlottedLowering> l;
  if (!o.one_pass_backward || o.accumulate_f16) return l;  // our kernels accumulate in fp32, as cuBLASLt by default
  l.push_back({FastPathSlot::backward_patterns, make_output_layer_backward_lowering()});
  l.push_back({FastPathSlot::backward_patterns, make_one_pass_wgmma_lowering(o)});
  l.push_back({FastPathSlot::backward_patterns, make_one_pass_row_ranges_lowering(o)});
  l.push_back({FastPathSlot::backward_patterns, make_one_pass_strips_lowering(o)});
  return l;
}

std::string one_pass_why_not(const sg::Graph& g, const BackendOptions& o, bool /*device_present*/) {
  if (!o.one_pass_backward) return "turned off (backend.one_pass_backward: false)";
  if (std::string why = accumulates_f16(o); !why.empty()) return why;
  if (std::string why = no_fp16_weights(g); !why.empty()) return why;
  return not_plain_sgd(g);
}

}  // namespace

FastPath one_pass_backward_fast_path() {
  return {"one_pass_backward",
          "a layer's dgrad and SGD update in one pass over W; the output layer's whole backward in one kernel",
          {"one_pass_backward", "fold_input_update", "one_pass_multicast", "strip_splits"},
          one_pass_lowerings,
          one_pass_why_not};
}

}  // namespace sg::cuda
