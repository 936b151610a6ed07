// Lowering: the classifier's forward, y = x W^T + b with N <= 32 outputs,
// by our kernel (ops/cuda/small_linear.cu): cuBLASLt tiles such a thin
// output badly. fp16 in and out, fp32 accumulation like cuBLASLt's.
#include "ops/cuda/small_linear.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"

namespace sg::cuda {
namespace {

struct ForwardNodes {
  NodeId matmul = -1;
  ValueId bias = -1, output = -1;
};

class SmallNForwardLowering final : public CudaLowering {
 public:
  explicit SmallNForwardLowering(const BackendOptions& options) : options_(options) {}
  std::string_view name() const override { return "small_n_forward"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    const sg::Graph& g = cover.graph();
    if (options_.accumulate_f16 || !cover.is_group(unit, FusionKind::linear_forward)) return std::nullopt;
    const Node& last = g.node(unit.nodes.back());
    if (last.op != OpKind::bias_add) return std::nullopt;  // no ReLU
    ForwardNodes f{node_of(g, unit, OpKind::matmul), last.inputs[1], last.outputs[0]};
    const MatmulShape s = forward_shape(g, f.matmul, Epilogue::bias, g.value(f.output).dtype);
    if (s.ab_type != ElemType::f16 || s.cd_type != ElemType::f16 || s.trans_a || !s.trans_b || s.n > kSmallLinearMaxDim)
      return std::nullopt;
    Match m = single_unit(unit);
    m.detail = f;
    return m;
  }

  std::string describe(const sg::Graph&, const Launch&) const override { return "epilogue=bias"; }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto& f = detail_of<ForwardNodes>(l);
    const Node& mm = g.node(f.matmul);
    const MatmulShape s = operand_shape(g, mm);
    const auto* x = static_cast<const __half*>(c.ptr(mm.inputs[0]));
    const auto* w = static_cast<const __half*>(c.ptr(mm.inputs[1]));
    const auto* bias = static_cast<const __half*>(c.ptr(f.bias));
    auto* y = static_cast<__half*>(c.ptr(f.output));
    const bool dependent = c.options().dependent_launch, mma = c.options().classifier_mma;
    return std::make_unique<BoundLaunch>(
        [=](cudaStream_t st) { launch_linear_small_n(x, w, bias, s.m, s.n, s.k, y, st, dependent, mma); },
        "small-dim kernel");
  }

 private:
  BackendOptions options_;
};

}  // namespace

std::unique_ptr<CudaLowering> make_small_n_forward_lowering(const BackendOptions& options) {
  return std::make_unique<SmallNForwardLowering>(options);
}

}  // namespace sg::cuda
