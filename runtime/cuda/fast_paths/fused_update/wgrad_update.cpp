// Lowering: a layer's weight-gradient matmul (dY^T X, fp16 inputs) [+ the
// cast of its output to fp32 master weights] fused with the weight's update
// by any update rule (update_rule_table.hpp): each tile of the gradient goes
// straight from the accumulators into the update
// (ops/cuda/fast_paths/fused_update/wgrad_update.hpp), with no gradient
// buffer and no pass of its own. The launch runs where the matmul sits, so
// every other reader of W (its forward, its dgrad) must come before it; the
// step counter is read before its advance (which stays with the remaining
// updates). Not with clipping: the clip scale exists only after every
// gradient (the update then reads it, and update_multi_tensor takes it).
#include "ops/cuda/fast_paths/fused_update/wgrad_update.hpp"
#include "runtime/cuda/lowerings/lone_units.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"
#include "runtime/cuda/lowerings/optimizer_support.hpp"
#include "ops/cuda/fast_paths/measured_costs.hpp"
#include "runtime/cuda/lowerings/update_rule_table.hpp"

namespace sg::cuda {
namespace {

// Where it runs: fp32 master weights, a small batch and W (the measured
// rule and its numbers: measured::kWgradUpdateMaxBatch, ops/cuda/fast_paths/measured_costs.hpp).

struct WgradUpdateNodes {
  NodeId matmul = -1, cast = -1, update = -1;
};

class WgradUpdateLowering final : public CudaLowering {
 public:
  explicit WgradUpdateLowering(const BackendOptions& options) : options_(options) {}
  std::string_view name() const override { return "wgrad_update"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    const sg::Graph& g = cover.graph();
    if (options_.accumulate_f16 || unit.fusion_group >= 0 || unit.nodes.size() != 1) return std::nullopt;
    const Node& mm = g.node(unit.nodes.front());
    if (mm.op != OpKind::matmul) return std::nullopt;
    const auto& attrs = mm.attr<MatmulAttrs>();
    const Value& dy = g.value(mm.inputs[0]);
    const Value& x = g.value(mm.inputs[1]);
    const Value& grad = g.value(mm.outputs[0]);
    if (!attrs.trans_a || attrs.trans_b || dy.dtype != DType::f16 || x.dtype != DType::f16 ||
        (grad.dtype != DType::f16 && grad.dtype != DType::f32))
      return std::nullopt;
    WgradUpdateNodes nodes{mm.id, -1, -1};
    Match m = single_unit(unit);
    NodeId reader = sole_reader(g, grad.id);
    DType update_grad = grad.dtype;
    if (reader >= 0 && g.node(reader).op == OpKind::cast) {  // fp32 master weights: the f16 gradient widened
      const Node& cast = g.node(reader);
      const CoverUnit* cast_unit = free_lone_unit(cover, cast.id);
      update_grad = g.value(cast.outputs[0]).dtype;
      if (!cast_unit || grad.dtype != DType::f16 || update_grad != DType::f32) return std::nullopt;
      nodes.cast = cast.id;
      m.units.push_back(cast_unit->id);
      reader = sole_reader(g, cast.outputs[0]);
    }
    if (reader < 0) return std::nullopt;
    const Node& update = g.node(reader);
    const CoverUnit* update_unit = free_lone_unit(cover, update.id);
    const auto inputs = update_inputs(update);
    if (!inputs || inputs->clip_scale >= 0 || !update_unit ||
        inputs->grad != (nodes.cast >= 0 ? g.node(nodes.cast).outputs[0] : grad.id))
      return std::nullopt;
    const Value& w = g.value(inputs->param);
    const bool types_ok = (w.dtype == DType::f16 && update_grad == DType::f16) ||
                          (w.dtype == DType::f32 && update_grad == DType::f32);
    bool states_f32 = true;
    for (ValueId slot : inputs->state) states_f32 = states_f32 && (slot < 0 || g.value(slot).dtype == DType::f32);
    if (!types_ok || w.shape != grad.shape || !states_f32) return std::nullopt;
    // W changes where the matmul sits: every other reader must come before it.
    for (NodeId r : g.consumers(w.id))
      if (r != update.id && r > mm.id) return std::nullopt;
    if (!wgrad_update_unsupported(dy.shape[0], w.shape[0], w.shape[1]).empty()) return std::nullopt;
    if (w.dtype != DType::f32 || dy.shape[0] > measured::kWgradUpdateMaxBatch ||
        w.shape[0] * w.shape[1] > measured::kWgradUpdateMaxWeightElements)
      return std::nullopt;  // where the buffered path measured faster (above)
    nodes.update = update.id;
    m.units.push_back(update_unit->id);
    m.detail = nodes;
    return m;
  }

  std::string describe(const sg::Graph& g, const Launch& l) const override {
    const auto& nodes = detail_of<WgradUpdateNodes>(l);
    return fmt::format("tile into {}{}", update_rule_name(g.node(nodes.update)), nodes.cast >= 0 ? ",fp32 master" : "");
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto& nodes = detail_of<WgradUpdateNodes>(l);
    const Node& mm = g.node(nodes.matmul);
    const Node& update = g.node(nodes.update);
    const UpdateInputs in = *update_inputs(update);
    const Value& w = g.value(in.param);
    const auto* dy = static_cast<const __half*>(c.ptr(mm.inputs[0]));
    const auto* x = static_cast<const __half*>(c.ptr(mm.inputs[1]));
    const std::int64_t batch = g.value(mm.inputs[0]).shape[0], n = w.shape[0], k = w.shape[1];
    void* wp = c.ptr(w.id);
    const StateSlots state = state_slots(in, [&](ValueId v) { return c.ptr(v); });
    const auto* step = in.step >= 0 ? static_cast<const std::int32_t*>(c.ptr(in.step)) : nullptr;
    const UpdateScalars* scalars = c.update_scalars(update.id);
    const bool dependent = c.options().dependent_launch;
    const DType grad = g.value(mm.outputs[0]).dtype;  // what the matmul would have written
    std::function<void(cudaStream_t)> run;
    with_update_rule(update, [&](auto rule, auto hyper) {
      using Rule = typename decltype(rule)::type;
      if (w.dtype == DType::f16)
        run = [=](cudaStream_t s) {
          launch_wgrad_update<Rule, __half, __half>(dy, x, batch, n, k, static_cast<__half*>(wp), state, scalars, step,
                                                    hyper, s, dependent);
        };
      else if (grad == DType::f16)
        run = [=](cudaStream_t s) {
          launch_wgrad_update<Rule, float, __half>(dy, x, batch, n, k, static_cast<float*>(wp), state, scalars, step,
                                                   hyper, s, dependent);
        };
      else
        run = [=](cudaStream_t s) {
          launch_wgrad_update<Rule, float, float>(dy, x, batch, n, k, static_cast<float*>(wp), state, scalars, step,
                                                  hyper, s, dependent);
        };
    });
    return std::make_unique<BoundLaunch>(std::move(run), "tensor-core tile");
  }

 private:
  BackendOptions options_;
};

}  // namespace

// (The factory keeps its issue-21 name: runtime/cuda/lowerings/registry.cpp calls it.)
std::unique_ptr<CudaLowering> make_wgrad_update_lowering(const BackendOptions& options) {
  return std::make_unique<WgradUpdateLowering>(options);
}

}  // namespace sg::cuda
