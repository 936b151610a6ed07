// Lowering: label-smoothed cross-entropy (softmax_xent_smoothed) or its
// gradient, one node per launch, by our kernel (ops/cuda/losses.cu). The
// plain softmax_xent keeps its own fused lowerings (softmax_xent,
// output_layer_backward, the whole-step kernels); none of them takes these ops.
#include "ops/cuda/losses.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"

namespace sg::cuda {
namespace {

class SoftmaxXentSmoothedLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "softmax_xent_smoothed"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    if (unit.fusion_group >= 0) return std::nullopt;
    const sg::Graph& g = cover.graph();
    const Node& n = g.node(unit.nodes.front());
    if (n.op != OpKind::softmax_xent_smoothed && n.op != OpKind::softmax_xent_smoothed_backward) return std::nullopt;
    if (!is_floating(g.value(n.inputs[0]).dtype) || g.value(n.inputs[1]).dtype != DType::i32) return std::nullopt;
    return single_unit(unit);
  }

  std::string describe(const sg::Graph& g, const Launch& l) const override {
    return fmt::format("eps={:.3g}", g.node(l.nodes.front()).attr<LabelSmoothingAttrs>().eps);
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const Node& n = g.node(l.nodes.front());
    const auto eps = static_cast<float>(n.attr<LabelSmoothingAttrs>().eps);
    const auto scale = static_cast<float>(n.attr<LabelSmoothingAttrs>().gradient_scale);  // (the backward's)
    const Value& logits = g.value(n.inputs[0]);
    const auto rows = logits.shape[0], cols = logits.shape[1];
    const void* x = c.ptr(logits.id);
    const auto* labels = static_cast<const std::int32_t*>(c.ptr(n.inputs[1]));
    void* out = c.ptr(n.outputs[0]);
    const bool backward = n.op == OpKind::softmax_xent_smoothed_backward;
    std::function<void(cudaStream_t)> run;
    with_float_type(logits.dtype, [&](auto tag) {
      using T = decltype(tag);
      const T* in = static_cast<const T*>(x);
      float* loss = backward ? nullptr : static_cast<float*>(out);
      T* dlogits = backward ? static_cast<T*>(out) : nullptr;
      run = [=](cudaStream_t s) { launch_softmax_xent_smoothed(in, labels, rows, cols, eps, loss, dlogits, s, scale); };
    });
    return std::make_unique<BoundLaunch>(std::move(run), std::string(op_name(n.op)));
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_softmax_xent_smoothed_lowering() {
  return std::make_unique<SoftmaxXentSmoothedLowering>();
}

}  // namespace sg::cuda
