#include "runtime/cuda/fast_paths/one_pass_backward/one_pass_pattern.hpp"

namespace sg::cuda {
namespace {

// Whether some matmul takes the gradient `dy` back through `w` (a dgrad of w's layer).
bool has_dgrad(const sg::Graph& g, ValueId dy, ValueId w) {
  for (NodeId reader : g.consumers(dy)) {
    const Node& n = g.node(reader);
    if (n.op == OpKind::matmul && n.inputs[0] == dy && n.inputs[1] == w) return true;
  }
  return false;
}

// The first layer's plain-SGD update dX^T X_in into W_in, if the launch can
// take it: a layer whose input needs no gradient (no dgrad goes through W_in).
const CoverUnit* input_update_unit(const Cover& cover, const Node& dgrad, ValueId dx) {
  const sg::Graph& g = cover.graph();
  const Value& dy = g.value(dgrad.inputs[0]);
  const Value& w = g.value(dgrad.inputs[1]);
  for (NodeId reader : g.consumers(dx)) {
    const CoverUnit* u = cover.free_group_with(reader, FusionKind::wgrad_sgd);
    if (!u || u->nodes.size() != 2) continue;
    const Node& wgrad = g.node(node_of(g, *u, OpKind::matmul));
    const Node& sgd = g.node(node_of(g, *u, OpKind::sgd_update));
    const auto& attrs = wgrad.attr<MatmulAttrs>();
    if (wgrad.inputs[0] != dx || !plain_sgd(sgd) || !attrs.trans_a || attrs.trans_b) continue;
    const Value& x_in = g.value(wgrad.inputs[1]);
    const Value& w_in = g.value(sgd.inputs[0]);
    if (x_in.dtype != DType::f16 || w_in.dtype != DType::f16 || w_in.shape[0] != w.shape[1] ||
        w_in.shape[1] != x_in.shape[1] || has_dgrad(g, dx, w_in.id))
      continue;
    if (input_update_unsupported(dy.shape[0], w.shape[0], w.shape[1], x_in.shape[1]).empty()) return u;
  }
  return nullptr;
}

}  // namespace

namespace {

std::optional<Match> match_one_pass(const Cover& cover, const CoverUnit& unit, OnePassKernel kernel, bool input_update) {
  const sg::Graph& g = cover.graph();
  const std::optional<ActivationDgrad> d = activation_dgrad_of(cover, unit);
  if (!d) return std::nullopt;
  OnePassNodes p;
  p.dgrad = d->matmul;
  p.activation_backward = d->backward;
  p.activation = d->activation;
  const Node& mm = g.node(p.dgrad);
  const Value& dy = g.value(mm.inputs[0]);
  const Value& w = g.value(mm.inputs[1]);
  const auto& attrs = mm.attr<MatmulAttrs>();
  const Node& act_bw = g.node(p.activation_backward);
  if (attrs.trans_a || attrs.trans_b || dy.dtype != DType::f16 || w.dtype != DType::f16 || w.role != Role::param ||
      g.value(act_bw.inputs[1]).dtype != DType::f16 || g.value(act_bw.outputs[0]).dtype != DType::f16)
    return std::nullopt;
  const auto batch = dy.shape[0], n = w.shape[0], k = w.shape[1];
  if (!dgrad_wgrad_unsupported(batch, n, k).empty() || one_pass_kernel_for(batch, k) != kernel) return std::nullopt;
  const CoverUnit* update = free_weight_update(cover, dy.id, w.id, /*plain=*/true);
  if (!update) return std::nullopt;
  p.weight_sgd = node_of(g, *update, OpKind::sgd_update);
  p.x = act_bw.inputs[1];
  if (p.activation != Activation::relu) {
    // The update reads the activation's output; the backward may read the pre-activation instead.
    p.x = activation_output_of(g, act_bw, p.activation);
    if (p.x < 0 || g.node(node_of(g, *update, OpKind::matmul)).inputs[1] != p.x) return std::nullopt;
  }
  Match m;
  m.units = d->units;
  m.units.push_back(update->id);
  const ValueId dx = act_bw.outputs[0];
  if (const CoverUnit* bias = free_plain_bias_update_of(cover, dx)) {
    const NodeId sgd = node_of(g, *bias, OpKind::sgd_update);
    if (g.value(g.node(sgd).inputs[0]).dtype == DType::f16) {
      p.bias_sgd = sgd;
      m.units.push_back(bias->id);
    }
  }
  if (input_update)
    if (const CoverUnit* first = input_update_unit(cover, mm, dx)) {
      p.input_wgrad = node_of(g, *first, OpKind::matmul);
      p.input_sgd = node_of(g, *first, OpKind::sgd_update);
      m.units.push_back(first->id);
    }
  m.detail = p;
  return m;
}

std::string describe_one_pass(const Launch& l) {
  const auto& p = detail_of<OnePassNodes>(l);
  const std::string dgrad =
      p.activation == Activation::relu
          ? std::string("mask=relu output")
          : fmt::format("{}_backward reading the {}", activation_op_name(p.activation),
                        backward_reads_input(p.activation) ? "pre-activation" : "output");
  return dgrad + ",into=param(alpha=-lr,beta=1-lr*wd)" + (p.bias_sgd >= 0 ? ",+bias update" : "") +
         (p.input_sgd >= 0 ? ",+first layer's weight update" : "");
}

std::unique_ptr<RecordedLaunch> record_one_pass(const Launch& l, const BindContext& c) {
  const sg::Graph& g = c.graph();
  const auto& p = detail_of<OnePassNodes>(l);
  const Node& mm = g.node(p.dgrad);
  const Node& act_bw = g.node(p.activation_backward);
  const Value& w = g.value(mm.inputs[1]);
  struct Bound {
    std::unique_ptr<DgradWgradSgd> kernel;
    const __half *dy = nullptr, *x = nullptr, *pre_activation = nullptr;
    __half *w = nullptr, *dx = nullptr, *bias = nullptr;
    const UpdateScalars *sgd = nullptr, *bias_sgd = nullptr;
    one_pass::InputLayerUpdate input;
  };
  auto b = std::make_shared<Bound>();
  b->dy = static_cast<const __half*>(c.ptr(mm.inputs[0]));
  b->x = static_cast<const __half*>(c.ptr(p.x));
  if (backward_reads_input(p.activation)) b->pre_activation = static_cast<const __half*>(c.ptr(act_bw.inputs[1]));
  b->w = static_cast<__half*>(c.ptr(w.id));
  // dX stays in the kernel when only the folded first-layer update reads it.
  const ValueId dx = act_bw.outputs[0];
  if (std::find(l.writes.begin(), l.writes.end(), dx) != l.writes.end()) b->dx = static_cast<__half*>(c.ptr(dx));
  b->sgd = c.update_scalars(p.weight_sgd);
  if (p.bias_sgd >= 0) {
    b->bias = static_cast<__half*>(c.ptr(g.node(p.bias_sgd).inputs[0]));
    b->bias_sgd = c.update_scalars(p.bias_sgd);
  }
  std::int64_t input_width = 0;
  if (p.input_sgd >= 0) {
    const Node& wgrad = g.node(p.input_wgrad);
    input_width = g.value(wgrad.inputs[1]).shape[1];
    b->input.x = static_cast<const __half*>(c.ptr(wgrad.inputs[1]));
    b->input.w = static_cast<__half*>(c.ptr(g.node(p.input_sgd).inputs[0]));
    b->input.scalars = c.update_scalars(p.input_sgd);
    b->input.width = int(input_width);
  }
  const BackendOptions& o = c.options();
  DgradWgradOptions options;
  options.strip_splits = o.strip_splits;
  options.multicast = o.one_pass_multicast;
  options.dependent = o.dependent_launch;
  b->kernel = std::make_unique<DgradWgradSgd>(g.value(mm.inputs[0]).shape[0], w.shape[0], w.shape[1], options,
                                              input_width, p.activation);
  return std::make_unique<BoundLaunch>([b](cudaStream_t s) {
    b->kernel->launch(b->dy, b->x, b->w, b->dx, b->sgd, s, b->bias, b->bias_sgd, b->input, b->pre_activation);
  });
}

class OnePassLowering final : public CudaLowering {
 public:
  OnePassLowering(std::string_view name, OnePassKernel kernel, bool input_update, bool asks_device)
      : name_(name), kernel_(kernel), input_update_(input_update), asks_device_(asks_device) {}
  std::string_view name() const override { return name_; }
  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    return match_one_pass(cover, unit, kernel_, input_update_);
  }
  std::string describe(const sg::Graph&, const Launch& l) const override { return describe_one_pass(l); }
  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    return record_one_pass(l, c);
  }
  bool asks_device() const override { return asks_device_; }

 private:
  std::string name_;
  OnePassKernel kernel_;
  bool input_update_, asks_device_;
};

}  // namespace

std::unique_ptr<CudaLowering> make_one_pass_lowering(std::string_view name, OnePassKernel kernel, bool input_update,
                                                     bool asks_device) {
  return std::make_unique<OnePassLowering>(name, kernel, input_update, asks_device);
}

}  // namespace sg::cuda
