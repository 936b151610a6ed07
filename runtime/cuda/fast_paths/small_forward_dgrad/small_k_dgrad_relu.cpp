// Lowering: the classifier's dgrad through the activation before it,
// dX = act'(dY W) with K <= 32 summed terms, by our kernel
// (ops/cuda/small_linear.cu). For ReLU (a dgrad_drelu group) it masks by the
// sign of the ReLU output H, so the forward keeps no cuBLASLt mask for it;
// for the other activations it reads what their backward reads (the
// pre-activation for gelu, gelu_tanh and silu, the output for tanh and
// sigmoid): a dgrad_dgelu group, or a lone matmul and the lone activation
// backward after it (activation_nodes.hpp).
#include "ops/cuda/small_linear.hpp"
#include "runtime/cuda/lowerings/activation_nodes.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"

namespace sg::cuda {
namespace {

class SmallKDgradReluLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "small_k_dgrad_relu"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    const sg::Graph& g = cover.graph();
    const std::optional<ActivationDgrad> d = activation_dgrad_of(cover, unit);
    if (!d) return std::nullopt;
    const Node& mm = g.node(d->matmul);
    const MatmulShape s = operand_shape(g, mm);
    if (s.ab_type != ElemType::f16 || s.trans_a || s.trans_b || s.k > kSmallLinearMaxDim ||
        g.value(g.node(d->backward).outputs[0]).dtype != DType::f16 ||
        g.value(g.node(d->backward).inputs[1]).dtype != DType::f16)
      return std::nullopt;
    Match m;
    m.units = d->units;
    m.detail = *d;
    return m;
  }

  std::string describe(const sg::Graph&, const Launch& l) const override {
    const auto& d = detail_of<ActivationDgrad>(l);
    if (d.activation == Activation::relu) return "mask=relu output";
    return fmt::format("{}_backward reading the {}", activation_op_name(d.activation),
                       backward_reads_input(d.activation) ? "pre-activation" : "output");
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto& d = detail_of<ActivationDgrad>(l);
    const Node& mm = g.node(d.matmul);
    const Node& act_bw = g.node(d.backward);
    const MatmulShape s = operand_shape(g, mm);
    const auto* dy = static_cast<const __half*>(c.ptr(mm.inputs[0]));
    const auto* w = static_cast<const __half*>(c.ptr(mm.inputs[1]));
    const auto* saved = static_cast<const __half*>(c.ptr(act_bw.inputs[1]));
    auto* dx = static_cast<__half*>(c.ptr(act_bw.outputs[0]));
    const bool dependent = c.options().dependent_launch;
    const Activation act = d.activation;
    return std::make_unique<BoundLaunch>(
        [=](cudaStream_t st) { launch_dgrad_activation_small_k(act, dy, w, saved, s.m, s.n, s.k, dx, st, dependent); },
        "small-dim kernel");
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_small_k_dgrad_relu_lowering() { return std::make_unique<SmallKDgradReluLowering>(); }

}  // namespace sg::cuda
