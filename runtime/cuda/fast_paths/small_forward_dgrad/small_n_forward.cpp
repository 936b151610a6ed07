// Lowering: the classifier's forward, y = x W^T + b with N <= 32 outputs,
// by our kernel (ops/cuda/small_linear.cu): cuBLASLt tiles such a thin
// output badly. fp16 in and out, fp32 accumulation like cuBLASLt's. A lone
// activation producing x (an MLP's last GELU, SiLU, tanh or sigmoid: the
// ones cuBLASLt's epilogues leave to a launch of their own) is applied as
// the kernel loads x, and its output written there where another launch
// reads it (the classifier's weight gradient).
#include <algorithm>

#include "ops/cuda/small_linear.hpp"
#include "runtime/cuda/lowerings/activation_nodes.hpp"
#include "runtime/cuda/lowerings/lone_units.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"

namespace sg::cuda {
namespace {

struct ForwardNodes {
  NodeId matmul = -1;
  ValueId bias = -1, output = -1;
  NodeId activation = -1;  // the lone activation producing x, applied on its load
};

bool f16(const sg::Graph& g, ValueId v) { return g.value(v).dtype == DType::f16; }

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
    // The launch runs at the matmul's place (the weights' casts come between
    // the activation and it), so every other reader of the activation's
    // output must come later. Only on the tensor-core tiles (small_linear.hpp
    // says why): 64 rows and more, so never where the small-batch forward
    // (batch 16/32) takes the layer before with the activation in its
    // epilogue, nor before the fused output layer (output_layer_backward.cu).
    const NodeId producer = g.value(g.node(f.matmul).inputs[0]).producer;
    const CoverUnit* act = free_lone_unit(cover, producer);
    if (act && options_.classifier_mma && linear_small_n_tiles_fit(s.m, s.n, s.k) &&
        forward_activation(g.node(producer).op) && f16(g, g.node(producer).inputs[0]) &&
        f16(g, g.node(producer).outputs[0])) {
      const auto& readers = g.consumers(g.node(producer).outputs[0]);
      if (std::all_of(readers.begin(), readers.end(), [&](NodeId r) { return r >= f.matmul; })) {
        f.activation = producer;
        m.units.push_back(act->id);
        m.runs_at_unit = unit.id;
      }
    }
    m.detail = f;
    return m;
  }

  std::string describe(const sg::Graph& g, const Launch& l) const override {
    const auto& f = detail_of<ForwardNodes>(l);
    if (f.activation < 0) return "epilogue=bias";
    return fmt::format("{} on the input's load,epilogue=bias", op_name(g.node(f.activation).op));
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto& f = detail_of<ForwardNodes>(l);
    const Node& mm = g.node(f.matmul);
    const MatmulShape s = operand_shape(g, mm);
    InputActivation input;
    ValueId x_value = mm.inputs[0];
    if (f.activation >= 0) {
      const Node& act = g.node(f.activation);
      input.on = true;
      input.activation = *forward_activation(act.op);
      if (launch_writes(l, act.outputs[0])) input.activated = static_cast<__half*>(c.ptr(act.outputs[0]));
      x_value = act.inputs[0];
    }
    const auto* x = static_cast<const __half*>(c.ptr(x_value));
    const auto* w = static_cast<const __half*>(c.ptr(mm.inputs[1]));
    const auto* bias = static_cast<const __half*>(c.ptr(f.bias));
    auto* y = static_cast<__half*>(c.ptr(f.output));
    const bool dependent = c.options().dependent_launch, mma = c.options().classifier_mma;
    return std::make_unique<BoundLaunch>(
        [=](cudaStream_t st) { launch_linear_small_n(x, w, bias, s.m, s.n, s.k, y, st, dependent, mma, input); },
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
