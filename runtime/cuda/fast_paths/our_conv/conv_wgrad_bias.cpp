// Lowering conv_wgrad_bias (fast path our_conv): a convolution's bias
// gradient with its weight gradient in ONE pass of our direct kernel
// (ops/cuda/conv_direct_wgrad.cu, the plan's bias_gradient), where our
// kernel runs that weight gradient anyway. Both read all of dY; apart, the
// bias's column or channel sums were a launch of their own that read it
// again (mnist_cnn_fast's first layer: 6.4 MB, 8 us on an H200).
// It takes the nodes conv_bias_gradient.hpp names, where the weight gradient
// is ours (the lowering conv_implicit_gemm would take: ours for the layout
// and within the record's channel limit).
// A bias gradient in an SGD fusion group stays with its fused update.
// Ranked ahead of column_sum and channel_sum (slot backward_patterns), which
// would otherwise take the bias gradient first.
#include "ops/cuda/conv_implicit_gemm.hpp"
#include "runtime/cuda/lowerings/conv_bias_gradient.hpp"

namespace sg::cuda {
namespace {

class ConvWgradBiasLowering final : public CudaLowering {
 public:
  explicit ConvWgradBiasLowering(std::int64_t max_channel_product) : max_channel_product_(max_channel_product) {}

  std::string_view name() const override { return "conv_wgrad_bias"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    return match_wgrad_bias(cover, unit, [&](const ConvSizes& z, DType) {
      // Ours reads channels-last dY for one input channel only, and writes [K,C,R,S].
      if ((z.channels_last && z.c != 1) || !filter_bytes_kcrs(z)) return false;
      if (max_channel_product_ > 0 && z.c * z.k > max_channel_product_) return false;
      // One multiprocessor stages the most rows a block (no row splits): a
      // plan that fits then fits every GPU.
      return plan_implicit_gemm(ConvPass::backward_filter, implicit_gemm_shape(z), 1, true, true).bias_gradient;
    });
  }

  std::string describe(const sg::Graph& g, const Launch& l) const override { return describe_wgrad_bias(g, l); }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto& nodes = detail_of<WgradBiasNodes>(l);
    const Node& w = g.node(nodes.wgrad);
    const ImplicitGemmPlan plan =
        plan_implicit_gemm(ConvPass::backward_filter, implicit_gemm_shape(conv_sizes(g, w)),
                           current_device_attribute(cudaDevAttrMultiProcessorCount), true, true);
    if (!plan.bias_gradient) throw CudaError("conv_wgrad_bias: the direct weight gradient no longer fits");
    void* const* workspace = c.workspace(plan.workspace_bytes());
    const void* dy = c.ptr(w.inputs[0]);
    const void* x = c.ptr(w.inputs[1]);
    void* dw = c.ptr(w.outputs[0]);
    const ConvBiasGradient bias{c.ptr(g.node(nodes.cast >= 0 ? nodes.cast : nodes.sum).outputs[0]), nodes.cast >= 0};
    std::function<void(cudaStream_t)> run;
    with_float_type(g.value(w.outputs[0]).dtype, [&](auto tag) {
      using T = decltype(tag);
      run = [=](cudaStream_t s) {
        launch_conv_backward_filter(plan, static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<T*>(dw),
                                    static_cast<float*>(*workspace), s, bias);
      };
    });
    return std::make_unique<BoundLaunch>(std::move(run), describe_plan(plan));
  }

 private:
  std::int64_t max_channel_product_;  // 0: any convolution
};

}  // namespace

std::unique_ptr<CudaLowering> make_conv_wgrad_bias_lowering(std::int64_t max_channel_product) {
  return std::make_unique<ConvWgradBiasLowering>(max_channel_product);
}

}  // namespace sg::cuda
