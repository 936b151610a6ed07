// Fast path our_conv: our implicit-GEMM convolution (ops/cuda/conv_implicit_gemm.cu)
// ahead of cuDNN where it measured faster: few channels
// (measured::kOurConvMaxChannelProduct). With backend.conv_kernels:
// implicit_gemm the core runs ours first for every convolution anyway, and
// where cuDNN is missing or refuses, ours is the core's fallback. Where ours
// runs a weight gradient, the bias gradient of the same dY rides in its pass
// (conv_wgrad_bias.cpp).
#include <fmt/format.h>

#include "runtime/cuda/fast_paths/fast_path.hpp"
#include "ops/cuda/fast_paths/measured_costs.hpp"

namespace sg::cuda {

std::unique_ptr<CudaLowering> make_conv_implicit_gemm_lowering(std::int64_t max_channel_product);
std::unique_ptr<CudaLowering> make_conv_wgrad_bias_lowering(std::int64_t max_channel_product);

namespace {

std::vector<SlottedLowering> our_conv_lowerings(const BackendOptions& o) {
  std::vector<SlottedLowering> l;
  // (tensor_core adds the channels-last tensor-core kernels; these stay for what they take.)
  if (o.conv_kernels != ConvKernels::automatic && o.conv_kernels != ConvKernels::tensor_core) return l;
  // Before column_sum and channel_sum would take the bias gradient alone.
  l.push_back({FastPathSlot::backward_patterns, make_conv_wgrad_bias_lowering(measured::kOurConvMaxChannelProduct)});
  l.push_back({FastPathSlot::convolution, make_conv_implicit_gemm_lowering(measured::kOurConvMaxChannelProduct)});
  return l;
}

std::string our_conv_why_not(const sg::Graph& g, const BackendOptions& o, bool /*device_present*/) {
  std::string first_too_wide;
  int layer = 0;
  bool any = false;
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::conv2d) continue;
    any = true;
    ++layer;
    const auto& w = g.value(n.inputs[1]).shape;  // [out, in, kh, kw]
    if (w[0] * w[1] <= measured::kOurConvMaxChannelProduct) {
      first_too_wide.clear();
      break;
    }
    if (first_too_wide.empty())
      first_too_wide = fmt::format("conv layer {} is {}->{}: more than {} channel products (cuDNN measured faster)",
                                   layer, w[1], w[0], measured::kOurConvMaxChannelProduct);
  }
  if (!any) return "the graph has no convolution";
  if (o.conv_kernels == ConvKernels::cudnn) return "backend.conv_kernels: cudnn";
  if (o.conv_kernels == ConvKernels::implicit_gemm)
    return "backend.conv_kernels: implicit_gemm (the core runs ours for every convolution)";
  return first_too_wide;
}

// Its lowering and the core's fallback share a name: a conv_implicit_gemm
// launch is this record's where the record would take a convolution at all.
bool our_conv_took(const sg::Graph& g, const Launch& launch, const BackendOptions& o) {
  if (launch.lowering->name() == "conv_wgrad_bias") return true;
  return launch.lowering->name() == "conv_implicit_gemm" && our_conv_why_not(g, o, false).empty();
}

}  // namespace

FastPath our_conv_fast_path() {
  return {"our_conv",
          "our implicit-GEMM convolutions ahead of cuDNN where they measured faster (few channels), a bias "
          "gradient in its weight gradient's pass",
          {},
          our_conv_lowerings,
          our_conv_why_not,
          our_conv_took};
}

}  // namespace sg::cuda
