// Fast path tensor_core_conv: our channels-last tensor-core convolutions
// (tensor_core_conv.cpp, ops/cuda/fast_paths/tensor_core_conv/) ahead of
// cuDNN, opted into by backend.conv_kernels: tensor_core.
#include <fmt/format.h>

#include "runtime/cuda/fast_paths/fast_path.hpp"

namespace sg::cuda {

std::unique_ptr<CudaLowering> make_tensor_core_conv_lowering();
std::string tensor_core_conv_why_not_node(const sg::Graph& g, const Node& n);  // "" when ours takes it

namespace {

std::vector<SlottedLowering> tensor_core_conv_lowerings(const BackendOptions& o) {
  std::vector<SlottedLowering> l;
  if (o.conv_kernels != ConvKernels::tensor_core) return l;
  l.push_back({FastPathSlot::convolution, make_tensor_core_conv_lowering()});
  return l;
}

std::string tensor_core_conv_why_not(const sg::Graph& g, const BackendOptions& o, bool /*device_present*/) {
  if (o.conv_kernels != ConvKernels::tensor_core)
    return fmt::format("backend.conv_kernels is {}: these kernels run only with conv_kernels: tensor_core",
                       conv_kernels_name(o.conv_kernels));
  std::string first;
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::conv2d && n.op != OpKind::conv2d_backward_data) continue;
    const std::string why = tensor_core_conv_why_not_node(g, n);
    if (why.empty()) return "";
    if (first.empty()) first = fmt::format("{} node {}: {}", op_name(n.op), n.id, why);
  }
  return first.empty() ? "the graph has no convolution" : first;
}

}  // namespace

FastPath tensor_core_conv_fast_path() {
  return {"tensor_core_conv",
          "channels-last f16/bf16 convolutions (forward [+bias+relu], backward data at stride 1) on our "
          "tensor-core kernels (backend.conv_kernels: tensor_core; with backend.autotune only where timed faster "
          "than cuDNN)",
          {},
          tensor_core_conv_lowerings,
          tensor_core_conv_why_not,
          nullptr};
}

}  // namespace sg::cuda
