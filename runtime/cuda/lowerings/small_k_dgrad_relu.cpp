// Lowering: the classifier's dgrad masked by the ReLU before it, dX = (dY W)
// * (H > 0) with K <= 32 summed terms, by our kernel (ops/cuda/small_linear.cu).
// It masks by the sign of the ReLU output H, so the forward keeps no
// cuBLASLt mask for it.
#include "ops/cuda/small_linear.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"

namespace sg::cuda {
namespace {

struct DgradNodes {
  NodeId matmul = -1, relu_backward = -1;
};

class SmallKDgradReluLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "small_k_dgrad_relu"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    const sg::Graph& g = cover.graph();
    if (!cover.is_group(unit, FusionKind::dgrad_drelu)) return std::nullopt;
    DgradNodes d{node_of(g, unit, OpKind::matmul), node_of(g, unit, OpKind::relu_backward)};
    const Node& mm = g.node(d.matmul);
    const MatmulShape s = operand_shape(g, mm);
    if (s.ab_type != ElemType::f16 || s.trans_a || s.trans_b || s.k > kSmallLinearMaxDim ||
        g.value(g.node(d.relu_backward).outputs[0]).dtype != DType::f16 ||
        g.value(g.node(d.relu_backward).inputs[1]).dtype != DType::f16)
      return std::nullopt;
    Match m = single_unit(unit);
    m.detail = d;
    return m;
  }

  std::string describe(const sg::Graph&, const Launch&) const override { return "mask=relu output"; }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto& d = detail_of<DgradNodes>(l);
    const Node& mm = g.node(d.matmul);
    const Node& relu_bw = g.node(d.relu_backward);
    const MatmulShape s = operand_shape(g, mm);
    const auto* dy = static_cast<const __half*>(c.ptr(mm.inputs[0]));
    const auto* w = static_cast<const __half*>(c.ptr(mm.inputs[1]));
    const auto* h = static_cast<const __half*>(c.ptr(relu_bw.inputs[1]));
    auto* dx = static_cast<__half*>(c.ptr(relu_bw.outputs[0]));
    const bool dependent = c.options().dependent_launch;
    return std::make_unique<BoundLaunch>(
        [=](cudaStream_t st) { launch_dgrad_relu_small_k(dy, w, h, s.m, s.n, s.k, dx, st, dependent); },
        "small-dim kernel");
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_small_k_dgrad_relu_lowering() { return std::make_unique<SmallKDgradReluLowering>(); }

}  // namespace sg::cuda
