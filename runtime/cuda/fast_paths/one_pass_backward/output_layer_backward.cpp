// Lowering: the output layer's whole backward in one kernel
// (ops/cuda/fast_paths/one_pass_backward/output_layer_backward.cu): softmax cross-entropy and its
// gradient dlogits, the classifier bias's update, the dgrad into the last
// hidden layer through its activation (masked by the ReLU output; any
// activation of ops/cuda/activation.hpp: activation_nodes.hpp), the
// classifier weight's update and the last hidden layer's bias update (fp16,
// plain SGD, few classes). It also takes the step advance as a rider.
#include "ops/cuda/fast_paths/one_pass_backward/output_layer_backward.hpp"
#include "runtime/cuda/lowerings/activation_nodes.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"

namespace sg::cuda {
namespace {

struct OutputLayerNodes {
  NodeId xent = -1, xent_backward = -1, out_bias_sgd = -1, dgrad = -1, activation_backward = -1, weight_sgd = -1,
         hidden_bias_sgd = -1;
  Activation activation = Activation::relu;  // of the activation_backward node
  ValueId h = -1;                             // the layer's input (the activation's output)
};

NodeId f16_bias_sgd(const Cover& cover, const CoverUnit* unit) {
  if (!unit) return -1;
  const sg::Graph& g = cover.graph();
  const NodeId sgd = node_of(g, *unit, OpKind::sgd_update);
  return g.value(g.node(sgd).inputs[0]).dtype == DType::f16 ? sgd : -1;
}

class OutputLayerBackwardLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "output_layer_backward"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    const sg::Graph& g = cover.graph();
    if (!cover.is_group(unit, FusionKind::xent_fused) || unit.nodes.size() != 2) return std::nullopt;
    OutputLayerNodes o;
    o.xent = node_of(g, unit, OpKind::softmax_xent);
    o.xent_backward = node_of(g, unit, OpKind::softmax_xent_backward);
    const Value& dlogits = g.value(g.node(o.xent_backward).outputs[0]);
    if (dlogits.dtype != DType::f16) return std::nullopt;
    // The kernel computes the gradient of the mean loss; a rank's pre-scaled one (issue 38) is not its case.
    if (g.node(o.xent_backward).attr<LossGradientAttrs>().scale != 1.0) return std::nullopt;
    const CoverUnit* out_bias = free_plain_bias_update_of(cover, dlogits.id);
    o.out_bias_sgd = f16_bias_sgd(cover, out_bias);
    std::optional<ActivationDgrad> dgrad;
    for (NodeId reader : g.consumers(dlogits.id))
      if (g.node(reader).op == OpKind::matmul)
        if (auto d = activation_dgrad_from_matmul(cover, reader)) dgrad = d;
    if (o.out_bias_sgd < 0 || !dgrad) return std::nullopt;
    o.dgrad = dgrad->matmul;
    o.activation_backward = dgrad->backward;
    o.activation = dgrad->activation;
    const Node& mm = g.node(o.dgrad);
    const Value& w = g.value(mm.inputs[1]);
    const auto& attrs = mm.attr<MatmulAttrs>();
    if (attrs.trans_a || attrs.trans_b || mm.inputs[0] != dlogits.id || w.dtype != DType::f16 || w.role != Role::param ||
        g.value(g.node(o.activation_backward).inputs[1]).dtype != DType::f16 ||
        g.value(g.node(o.activation_backward).outputs[0]).dtype != DType::f16 ||
        !output_layer_backward_unsupported(dlogits.shape[0], w.shape[0], w.shape[1]).empty())
      return std::nullopt;
    const CoverUnit* weight = free_weight_update(cover, dlogits.id, w.id, /*plain=*/true);
    const CoverUnit* hidden_bias = free_plain_bias_update_of(cover, g.node(o.activation_backward).outputs[0]);
    o.hidden_bias_sgd = f16_bias_sgd(cover, hidden_bias);
    if (!weight || o.hidden_bias_sgd < 0) return std::nullopt;
    o.weight_sgd = node_of(g, *weight, OpKind::sgd_update);
    // The kernel's h is both the weight update's input and (ReLU, tanh, sigmoid) what the backward reads.
    o.h = activation_output_of(g, g.node(o.activation_backward), o.activation);
    if (o.h < 0 || g.node(node_of(g, *weight, OpKind::matmul)).inputs[1] != o.h) return std::nullopt;
    Match m;
    m.units = {unit.id, out_bias->id};
    m.units.insert(m.units.end(), dgrad->units.begin(), dgrad->units.end());
    m.units.insert(m.units.end(), {weight->id, hidden_bias->id});
    m.detail = o;
    return m;
  }

  bool takes_rider(const sg::Graph& g, const Launch&, const Launch& rider) const override {
    return rider.nodes.size() == 1 && g.node(rider.nodes[0]).op == OpKind::advance_step;
  }

  std::string describe(const sg::Graph&, const Launch& l) const override {
    const Activation a = detail_of<OutputLayerNodes>(l).activation;
    if (a == Activation::relu) return "mask=relu output,+bias updates";
    return fmt::format("{}_backward reading the {},+bias updates", activation_op_name(a),
                       backward_reads_input(a) ? "pre-activation" : "output");
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto& o = detail_of<OutputLayerNodes>(l);
    const Node& xent = g.node(o.xent);
    const Node& act_bw = g.node(o.activation_backward);
    const Value& w = g.value(g.node(o.dgrad).inputs[1]);
    OutputLayerBackward a;
    a.logits = static_cast<const __half*>(c.ptr(xent.inputs[0]));
    a.labels = static_cast<const std::int32_t*>(c.ptr(xent.inputs[1]));
    a.h = static_cast<const __half*>(c.ptr(o.h));
    OutputLayerActivation act;
    act.activation = o.activation;
    if (backward_reads_input(o.activation)) act.pre_activation = static_cast<const __half*>(c.ptr(act_bw.inputs[1]));
    a.w = static_cast<__half*>(c.ptr(w.id));
    a.out_bias = static_cast<__half*>(c.ptr(g.node(o.out_bias_sgd).inputs[0]));
    a.hidden_bias = static_cast<__half*>(c.ptr(g.node(o.hidden_bias_sgd).inputs[0]));
    a.dh = static_cast<__half*>(c.ptr(act_bw.outputs[0]));
    a.loss = static_cast<float*>(c.ptr(xent.outputs[0]));
    const ValueId dlogits = g.node(o.xent_backward).outputs[0];
    if (std::find(l.writes.begin(), l.writes.end(), dlogits) != l.writes.end())
      a.dlogits = static_cast<__half*>(c.ptr(dlogits));
    for (NodeId r : l.riders) a.step = static_cast<std::int32_t*>(c.ptr(g.node(r).inputs[0]));
    a.w_sgd = c.update_scalars(o.weight_sgd);
    a.out_bias_sgd = c.update_scalars(o.out_bias_sgd);
    a.hidden_bias_sgd = c.update_scalars(o.hidden_bias_sgd);
    a.batch = g.value(dlogits).shape[0];
    a.classes = w.shape[0];
    a.hidden = w.shape[1];
    const bool dependent = c.options().dependent_launch;
    return std::make_unique<BoundLaunch>(
        [a, dependent, act](cudaStream_t s) { launch_output_layer_backward(a, s, dependent, act); });
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_output_layer_backward_lowering() {
  return std::make_unique<OutputLayerBackwardLowering>();
}

}  // namespace sg::cuda
