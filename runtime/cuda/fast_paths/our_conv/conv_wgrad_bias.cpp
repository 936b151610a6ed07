// Lowering conv_wgrad_bias (fast path our_conv): a convolution's bias
// gradient with its weight gradient in ONE pass of our direct kernel
// (ops/cuda/conv_direct_wgrad.cu, the plan's bias_gradient), where our
// kernel runs that weight gradient anyway. Both read all of dY; apart, the
// bias's column or channel sums were a launch of their own that read it
// again (mnist_cnn_fast's first layer: 6.4 MB, 8 us on an H200).
// It takes, on one dY:
//   - the bias gradient: channel_sum(dY) (NCHW) or reduce_rows of dY seen as
//     [N*H*W, C] (channels-last: graph/channels_last_pass.hpp);
//   - the free conv2d_backward_filter of dY (the lowering conv_implicit_gemm
//     would take: ours for the layout and within the record's channel limit);
//   - the cast of the f16/bf16 bias gradient to an fp32 master's, unless an
//     update reads it (update_multi_tensor and sgd_multi_tensor take those
//     with the weights' casts, in one launch for all).
// A bias gradient in an SGD fusion group stays with its fused update.
// Ranked ahead of column_sum and channel_sum (slot backward_patterns), which
// would otherwise take the bias gradient first.
#include "ops/cuda/conv_implicit_gemm.hpp"
#include "runtime/cuda/lowerings/conv_nodes.hpp"
#include "runtime/cuda/lowerings/update_rule_table.hpp"

namespace sg::cuda {
namespace {

struct WgradBiasNodes {
  NodeId wgrad = -1, sum = -1, cast = -1;
};

// The dY whose bias gradient node `sum` is, or -1: channel_sum(dY), or
// reduce_rows(reshape(dY)) with dY 4-D (channels-last).
ValueId bias_gradient_input(const sg::Graph& g, const Node& sum) {
  if (sum.op == OpKind::channel_sum) return sum.inputs[0];
  if (sum.op != OpKind::reduce_rows) return -1;
  const NodeId view = g.value(sum.inputs[0]).producer;
  if (view < 0 || g.node(view).op != OpKind::reshape) return -1;
  const ValueId dy = g.node(view).inputs[0];
  return g.value(dy).shape.size() == 4 ? dy : -1;
}

// Whether an SGD update alone reads v (sgd_multi_tensor takes its cast with the weights').
bool read_by_sgd_update(const sg::Graph& g, ValueId v) {
  const auto& readers = g.consumers(v);
  return readers.size() == 1 && g.node(readers[0]).op == OpKind::sgd_update;
}

// The conv2d_backward_filter reading dY as its gradient, or -1.
NodeId filter_gradient_of(const sg::Graph& g, ValueId dy) {
  for (NodeId r : g.consumers(dy))
    if (g.node(r).op == OpKind::conv2d_backward_filter && g.node(r).inputs[0] == dy) return r;
  return -1;
}

class ConvWgradBiasLowering final : public CudaLowering {
 public:
  explicit ConvWgradBiasLowering(std::int64_t max_channel_product) : max_channel_product_(max_channel_product) {}

  std::string_view name() const override { return "conv_wgrad_bias"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    if (unit.fusion_group >= 0) return std::nullopt;
    const sg::Graph& g = cover.graph();
    const Node& sum = g.node(unit.nodes.front());
    const ValueId dy = bias_gradient_input(g, sum);
    if (dy < 0) return std::nullopt;
    const NodeId wgrad = filter_gradient_of(g, dy);
    const CoverUnit* wgrad_unit = free_lone_unit(cover, wgrad);
    if (!wgrad_unit) return std::nullopt;
    const Node& w = g.node(wgrad);
    const DType t = g.value(dy).dtype;
    if (!is_floating(t) || g.value(w.inputs[1]).dtype != t || g.value(w.outputs[0]).dtype != t ||
        g.value(sum.outputs[0]).dtype != t)
      return std::nullopt;
    const ConvSizes z = conv_sizes(g, w);
    // The layout the sum reads is the convolution's; ours reads channels-last dY for one input channel only.
    if (z.channels_last != (sum.op == OpKind::reduce_rows) || (z.channels_last && z.c != 1)) return std::nullopt;
    if (max_channel_product_ > 0 && z.c * z.k > max_channel_product_) return std::nullopt;
    // One multiprocessor stages the most rows a block (no row splits): a
    // plan that fits then fits every GPU.
    if (!plan_implicit_gemm(ConvPass::backward_filter, implicit_gemm_shape(z), 1, true, true).bias_gradient)
      return std::nullopt;
    Match m = single_unit(unit);
    m.units.push_back(wgrad_unit->id);
    // The kernel reads dY itself, not the [N*H*W, C] view of it (made after
    // the weight gradient, where this launch runs).
    if (sum.inputs[0] != dy) m.unread.push_back(sum.inputs[0]);
    WgradBiasNodes nodes{wgrad, sum.id, -1};
    if (const CoverUnit* cast = free_widening_cast(cover, sum.outputs[0]);
        cast && !read_by_sgd_update(g, g.node(cast->nodes.front()).outputs[0])) {
      nodes.cast = cast->nodes.front();
      m.units.push_back(cast->id);
    }
    m.detail = nodes;
    return m;
  }

  std::string describe(const sg::Graph& g, const Launch& l) const override {
    const auto& nodes = detail_of<WgradBiasNodes>(l);
    const auto& a = g.node(nodes.wgrad).attr<Conv2dAttrs>();
    return fmt::format("wgrad+bias{},stride={},padding={}{}", nodes.cast >= 0 ? "+cast" : "", a.stride, a.padding,
                       a.channels_last ? ",channels_last" : "");
  }

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
