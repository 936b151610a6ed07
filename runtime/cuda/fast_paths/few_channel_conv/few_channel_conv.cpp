// Lowerings of fast path few_channel_conv (its record:
// few_channel_conv_record.cpp): a channels-last f16 / bf16 convolution of
// few input channels (an image network's first layer) by our tensor-core
// kernels (ops/cuda/fast_paths/few_channel_conv/):
//   few_channel_conv:  the forward [+ bias] [+ the relu after it];
//   few_channel_wgrad: the weight gradient, with the bias gradient of the
//     same dY (and its cast) in the same pass where the graph has one
//     (conv_bias_gradient.hpp), else alone.
// Its data gradient, where the graph has one (a first layer's input needs
// none), stays with the core's convolutions.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <memory>

#include "ops/cuda/fast_paths/few_channel_conv/few_channel_conv.hpp"
#include "runtime/cuda/lowerings/conv_bias_gradient.hpp"

namespace sg::cuda {

FewChannelConvShape few_channel_shape(const ConvSizes& z) {
  return {z.n, z.h, z.w, z.c, z.k, z.r, z.s, z.stride, z.padding};
}

namespace {

bool half_type(DType t) { return t == DType::f16 || t == DType::bf16; }

// "" when these kernels take a convolution of sizes z (its dtype checked apart).
std::string few_channel_sizes_why_not(const ConvSizes& z) {
  if (!z.channels_last) return "NCHW activations (these kernels take channels-last)";
  return few_channel_conv_why_not(few_channel_shape(z));
}

}  // namespace

// "" when these kernels take a convolution of `t` with sizes z.
std::string few_channel_why_not(const ConvSizes& z, DType t) {
  if (!half_type(t)) return fmt::format("{} activations (these kernels take f16 / bf16)", dtype_name(t));
  return few_channel_sizes_why_not(z);
}

namespace {

class FewChannelForwardLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "few_channel_conv"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    if (cover.graph().node(unit.nodes.front()).op != OpKind::conv2d) return std::nullopt;
    return match_conv(cover, unit, half_type, [](const ConvSizes& z) { return few_channel_sizes_why_not(z).empty(); });
  }

  std::string describe(const sg::Graph& g, const Launch& l) const override { return describe_conv(g, l); }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto& nodes = detail_of<ConvNodes>(l);
    const Node& n = g.node(nodes.conv);
    const FewChannelForwardPlan plan = plan_few_channel_forward(
        few_channel_shape(conv_sizes(g, n)), current_device_attribute(cudaDevAttrMultiProcessorCount));
    const void* x = c.ptr(n.inputs[0]);
    const void* w = c.ptr(n.inputs[1]);
    const void* bias = n.inputs.size() == 3 ? c.ptr(n.inputs[2]) : nullptr;
    const bool relu = nodes.relu >= 0;
    void* y = c.ptr(g.node(relu ? nodes.relu : nodes.conv).outputs[0]);
    std::function<void(cudaStream_t)> run;
    with_float_type(g.value(n.outputs[0]).dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, float>)
        run = [=](cudaStream_t s) {
          launch_few_channel_forward(plan, static_cast<const T*>(x), static_cast<const T*>(w),
                                     static_cast<const T*>(bias), relu, static_cast<T*>(y), s);
        };
    });
    if (!run) throw CudaError("few_channel_conv: f16 / bf16 only");
    return std::make_unique<BoundLaunch>(std::move(run), plan.describe());
  }
};

// with_bias: the bias-gradient unit with its weight gradient (slot
// backward_patterns, ahead of column_sum); else a lone weight gradient.
class FewChannelWgradLowering final : public CudaLowering {
 public:
  explicit FewChannelWgradLowering(bool with_bias) : with_bias_(with_bias) {}

  std::string_view name() const override { return "few_channel_wgrad"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    if (with_bias_)
      return match_wgrad_bias(cover, unit, [](const ConvSizes& z, DType t) { return few_channel_why_not(z, t).empty(); });
    const sg::Graph& g = cover.graph();
    if (g.node(unit.nodes.front()).op != OpKind::conv2d_backward_filter) return std::nullopt;
    return match_conv(cover, unit, half_type, [](const ConvSizes& z) { return few_channel_sizes_why_not(z).empty(); });
  }

  std::string describe(const sg::Graph& g, const Launch& l) const override {
    return with_bias_ ? describe_wgrad_bias(g, l) : describe_conv(g, l);
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const Node& w = g.node(with_bias_ ? detail_of<WgradBiasNodes>(l).wgrad : detail_of<ConvNodes>(l).conv);
    NodeId bias_node = -1;
    bool widened = false;
    if (with_bias_) {
      const auto& nodes = detail_of<WgradBiasNodes>(l);
      widened = nodes.cast >= 0;
      bias_node = widened ? nodes.cast : nodes.sum;
    }
    auto kernel = std::make_shared<const FewChannelWgrad>(few_channel_shape(conv_sizes(g, w)), with_bias_,
                                                          current_device_attribute(cudaDevAttrMultiProcessorCount));
    const void* dy = c.ptr(w.inputs[0]);
    const void* x = c.ptr(w.inputs[1]);
    void* dw = c.ptr(w.outputs[0]);
    void* db = bias_node >= 0 ? c.ptr(g.node(bias_node).outputs[0]) : nullptr;
    std::function<void(cudaStream_t)> run;
    with_float_type(g.value(w.outputs[0]).dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, float>) {
        const T* dyt = static_cast<const T*>(dy);
        const T* xt = static_cast<const T*>(x);
        T* dwt = static_cast<T*>(dw);
        if (widened)
          run = [=](cudaStream_t s) { kernel->run(dyt, xt, dwt, static_cast<float*>(db), s); };
        else
          run = [=](cudaStream_t s) { kernel->run(dyt, xt, dwt, static_cast<T*>(db), s); };
      }
    });
    if (!run) throw CudaError("few_channel_wgrad: f16 / bf16 only");
    return std::make_unique<BoundLaunch>(std::move(run), kernel->describe());
  }

 private:
  bool with_bias_;
};

}  // namespace

std::unique_ptr<CudaLowering> make_few_channel_forward_lowering() { return std::make_unique<FewChannelForwardLowering>(); }
std::unique_ptr<CudaLowering> make_few_channel_wgrad_lowering(bool with_bias) {
  return std::make_unique<FewChannelWgradLowering>(with_bias);
}

}  // namespace sg::cuda
