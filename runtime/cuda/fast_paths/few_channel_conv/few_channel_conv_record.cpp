// Fast path few_channel_conv: a channels-last network's convolutions of few
// input channels (its first layer) on our tensor-core kernels
// (few_channel_conv.cpp) ahead of our direct kernels and cuDNN, under
// backend.conv_kernels auto and tensor_core.
#include <fmt/format.h>

#include "runtime/cuda/fast_paths/fast_path.hpp"
#include "runtime/cuda/lowerings/conv_nodes.hpp"

namespace sg::cuda {

std::unique_ptr<CudaLowering> make_few_channel_forward_lowering();
std::unique_ptr<CudaLowering> make_few_channel_wgrad_lowering(bool with_bias);
std::string few_channel_why_not(const ConvSizes& z, DType t);  // "" when the kernels take it

namespace {

bool kernels_allowed(const BackendOptions& o) {
  return o.conv_kernels == ConvKernels::automatic || o.conv_kernels == ConvKernels::tensor_core;
}

std::vector<SlottedLowering> few_channel_conv_lowerings(const BackendOptions& o) {
  std::vector<SlottedLowering> l;
  if (!kernels_allowed(o)) return l;
  // Before conv_wgrad_bias and column_sum would take the bias gradient.
  l.push_back({FastPathSlot::backward_patterns, make_few_channel_wgrad_lowering(true)});
  // Before batch_fetch, the views and cast_params take what a first layer's forward takes with it.
  l.push_back({FastPathSlot::backward_patterns, make_few_channel_forward_lowering()});
  l.push_back({FastPathSlot::convolution, make_few_channel_wgrad_lowering(false)});
  return l;
}

std::string few_channel_conv_why_not(const sg::Graph& g, const BackendOptions& o, bool /*device_present*/) {
  if (!kernels_allowed(o))
    return fmt::format("backend.conv_kernels is {}: these kernels run under auto and tensor_core",
                       conv_kernels_name(o.conv_kernels));
  std::string first;
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::conv2d) continue;
    const std::string why = few_channel_why_not(conv_sizes(g, n), g.value(n.outputs[0]).dtype);
    if (why.empty()) return "";
    if (first.empty()) first = fmt::format("conv2d node {}: {}", n.id, why);
  }
  return first.empty() ? "the graph has no convolution" : first;
}

}  // namespace

FastPath few_channel_conv_fast_path() {
  return {"few_channel_conv",
          "channels-last f16/bf16 convolutions of 1-4 input channels (a first layer): forward [+bias+relu] and "
          "weight [+bias] gradient on our tensor-core kernels, ahead of cuDNN",
          {},
          few_channel_conv_lowerings,
          few_channel_conv_why_not,
          nullptr};
}

}  // namespace sg::cuda
