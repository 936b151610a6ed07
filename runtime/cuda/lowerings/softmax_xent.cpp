// Lowering: the loss. Softmax cross-entropy and its gradient as one kernel
// (the xent_fused group), or either alone, and the eval graph's
// count_correct (ops/cuda/softmax_xent.cu).
#include "runtime/cuda/lowerings/lowering_support.hpp"

namespace sg::cuda {
namespace {

struct LossNodes {
  NodeId forward = -1, backward = -1, count = -1;
};

class SoftmaxXentLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "softmax_xent"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    const sg::Graph& g = cover.graph();
    LossNodes nodes;
    if (cover.is_group(unit, FusionKind::xent_fused)) {
      nodes.forward = node_of(g, unit, OpKind::softmax_xent);
      nodes.backward = node_of(g, unit, OpKind::softmax_xent_backward);
    } else if (unit.fusion_group < 0) {
      const Node& n = g.node(unit.nodes.front());
      if (n.op == OpKind::softmax_xent) nodes.forward = n.id;
      else if (n.op == OpKind::softmax_xent_backward) nodes.backward = n.id;
      else if (n.op == OpKind::count_correct) nodes.count = n.id;
      else return std::nullopt;
    } else {
      return std::nullopt;
    }
    const NodeId any = nodes.forward >= 0 ? nodes.forward : nodes.backward >= 0 ? nodes.backward : nodes.count;
    if (any < 0 || !is_floating(g.value(g.node(any).inputs[0]).dtype)) return std::nullopt;
    Match m = single_unit(unit);
    m.detail = nodes;
    return m;
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto& nodes = detail_of<LossNodes>(l);
    const NodeId any = nodes.forward >= 0 ? nodes.forward : nodes.backward >= 0 ? nodes.backward : nodes.count;
    const Node& n = g.node(any);
    const Value& logits = g.value(n.inputs[0]);
    const void* x = c.ptr(logits.id);
    const auto* labels = static_cast<const std::int32_t*>(c.ptr(n.inputs[1]));
    const auto rows = logits.shape[0], cols = logits.shape[1];
    const bool dependent = c.options().dependent_launch;
    std::function<void(cudaStream_t)> run;
    with_float_type(logits.dtype, [&](auto tag) {
      using T = decltype(tag);
      const T* in = static_cast<const T*>(x);
      if (nodes.count >= 0) {
        auto* correct = static_cast<std::int32_t*>(c.ptr(n.outputs[0]));
        run = [=](cudaStream_t s) { launch_count_correct(in, labels, rows, cols, correct, s); };
        return;
      }
      float* loss = nodes.forward >= 0 ? static_cast<float*>(c.ptr(g.node(nodes.forward).outputs[0])) : c.scratch_float();
      T* dlogits = nodes.backward >= 0 ? static_cast<T*>(c.ptr(g.node(nodes.backward).outputs[0])) : nullptr;
      const auto scale =
          nodes.backward >= 0 ? static_cast<float>(g.node(nodes.backward).attr<LossGradientAttrs>().scale) : 1.f;
      run = [=](cudaStream_t s) { launch_softmax_xent(in, labels, rows, cols, loss, dlogits, s, dependent, scale); };
    });
    return std::make_unique<BoundLaunch>(std::move(run));
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_softmax_xent_lowering() { return std::make_unique<SoftmaxXentLowering>(); }

}  // namespace sg::cuda
