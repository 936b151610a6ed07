// Lowering: a regression loss (mse_loss, l1_loss) or its gradient
// (mse_loss_backward, l1_loss_backward), one node per launch, by our kernels
// (ops/cuda/losses.cu). Predictions in any floating dtype; targets f32 (the
// float-target batch the fetch gathers).
#include "ops/cuda/losses.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"

namespace sg::cuda {
namespace {

std::optional<RegressionLoss> loss_kind(OpKind op) {
  switch (op) {
    case OpKind::mse_loss:
    case OpKind::mse_loss_backward: return RegressionLoss::mse;
    case OpKind::l1_loss:
    case OpKind::l1_loss_backward: return RegressionLoss::l1;
    default: return std::nullopt;
  }
}

bool is_backward(OpKind op) { return op == OpKind::mse_loss_backward || op == OpKind::l1_loss_backward; }

class RegressionLossLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "regression_loss"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    if (unit.fusion_group >= 0) return std::nullopt;
    const sg::Graph& g = cover.graph();
    const Node& n = g.node(unit.nodes.front());
    if (!loss_kind(n.op) || !is_floating(g.value(n.inputs[0]).dtype) || g.value(n.inputs[1]).dtype != DType::f32)
      return std::nullopt;
    return single_unit(unit);
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const Node& n = g.node(l.nodes.front());
    const RegressionLoss kind = *loss_kind(n.op);
    const Value& pred = g.value(n.inputs[0]);
    const auto count = element_count(pred.shape);
    const void* p = c.ptr(pred.id);
    const auto* target = static_cast<const float*>(c.ptr(n.inputs[1]));
    void* out = c.ptr(n.outputs[0]);
    const bool backward = is_backward(n.op);
    const auto scale = backward ? static_cast<float>(n.attr<LossGradientAttrs>().scale) : 1.f;
    std::function<void(cudaStream_t)> run;
    with_float_type(pred.dtype, [&](auto tag) {
      using T = decltype(tag);
      const T* in = static_cast<const T*>(p);
      if (backward)
        run = [=](cudaStream_t s) {
          launch_regression_loss_backward(kind, in, target, count, static_cast<T*>(out), s, scale);
        };
      else
        run = [=](cudaStream_t s) { launch_regression_loss(kind, in, target, count, static_cast<float*>(out), s); };
    });
    return std::make_unique<BoundLaunch>(std::move(run), std::string(op_name(n.op)));
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_regression_loss_lowering() { return std::make_unique<RegressionLossLowering>(); }

}  // namespace sg::cuda
