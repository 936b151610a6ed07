// Lowering: a layer's weight-gradient matmul (dY^T X, fp16 inputs) [+ the
// cast of its output to fp32 master weights] fused with the weight's update
// by any update rule (update_rule_table.hpp): each tile of the gradient goes
// straight from the accumulators into the update
// (ops/cuda/fast_paths/fused_update/wgrad_update.hpp), with no gradient
// buffer and no pass of its own. The launch runs where the matmul sits, so
// every other reader of W (its forward, its dgrad) must come before it; the
// step counter is read before its advance (which rides with the remaining
// updates, or runs alone when every update is in a tile). Not with clipping: the clip scale exists only after every
// gradient (the update then reads it, and update_multi_tensor takes it).
// The layer's bias rides along where its gradient is a lone reduce_rows of
// the same dY [+ its widening cast] into the same rule on the same types: the
// launch then sits at the earlier of the sums and the matmul, and a linear
// layer's weight and bias gradients and updates are one launch.
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
  NodeId bias_sums = -1, bias_cast = -1, bias_update = -1;  // -1: no bias in the launch
};

// Whether every reader of `param` other than `update` comes before node `first`.
bool read_before(const sg::Graph& g, ValueId param, NodeId update, NodeId first) {
  for (NodeId r : g.consumers(param))
    if (r != update && r >= first) return false;
  return true;
}

// The bias of the layer whose weight gradient reads dy: a free lone
// reduce_rows of dy [-> its free widening cast] -> a free update node of the
// weight's rule (`update_op`) whose parameter has W's dtype and N elements,
// its sums rounded to `grad` (what the weight's matmul writes). Appends the
// units to m and fills nodes' bias fields; false (nothing changed) otherwise.
// (nodes: the weight's, filled; w_param: the weight.)
bool take_bias(const Cover& cover, ValueId dy, ValueId w_param, OpKind update_op, DType w, DType grad, Match& m,
               WgradUpdateNodes& nodes) {
  const sg::Graph& g = cover.graph();
  const std::int64_t n = g.value(dy).shape[1];
  for (NodeId r : g.consumers(dy)) {
    const Node& sums = g.node(r);
    const CoverUnit* sums_unit = free_lone_unit(cover, sums.id);
    if (sums.op != OpKind::reduce_rows || !sums_unit || g.value(sums.outputs[0]).dtype != grad) continue;
    const auto chain = sums_update(cover, sums);
    if (!chain || (chain->cast_unit && g.value(chain->grad).dtype != w)) continue;
    const Node& update = g.node(chain->update_unit->nodes.front());
    if (update.op != update_op) continue;
    const auto inputs = update_inputs(update);
    std::vector<int> units{sums_unit->id};
    if (chain->cast_unit) units.push_back(chain->cast_unit->id);
    const NodeId cast = chain->cast_unit ? chain->cast_unit->nodes.front() : -1;
    const Value& bias = g.value(inputs->param);
    bool states_f32 = true;
    for (ValueId slot : inputs->state) states_f32 = states_f32 && (slot < 0 || g.value(slot).dtype == DType::f32);
    if (bias.dtype != w || bias.shape != Shape{n} || !states_f32) continue;
    // Both parameters change where the launch sits: the earlier of the sums and the matmul.
    const NodeId first = std::min(sums.id, nodes.matmul);
    if (!read_before(g, inputs->param, update.id, first) || !read_before(g, w_param, nodes.update, first)) continue;
    units.push_back(chain->update_unit->id);
    m.units.insert(m.units.end(), units.begin(), units.end());
    nodes.bias_sums = sums.id, nodes.bias_cast = cast, nodes.bias_update = update.id;
    return true;
  }
  return false;
}

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
    // W changes where the launch sits: every other reader must come before it.
    if (!read_before(g, w.id, update.id, mm.id)) return std::nullopt;
    if (!wgrad_update_unsupported(dy.shape[0], w.shape[0], w.shape[1]).empty()) return std::nullopt;
    if (w.dtype != DType::f32 || dy.shape[0] > measured::kWgradUpdateMaxBatch ||
        w.shape[0] * w.shape[1] > measured::kWgradUpdateMaxWeightElements)
      return std::nullopt;  // where the buffered path measured faster (above)
    nodes.update = update.id;
    m.units.push_back(update_unit->id);
    take_bias(cover, dy.id, w.id, update.op, w.dtype, grad.dtype, m, nodes);
    m.detail = nodes;
    return m;
  }

  std::string describe(const sg::Graph& g, const Launch& l) const override {
    const auto& nodes = detail_of<WgradUpdateNodes>(l);
    return fmt::format("tile into {}{}{}", update_rule_name(g.node(nodes.update)), nodes.cast >= 0 ? ",fp32 master" : "",
                       nodes.bias_update >= 0 ? ",bias" : "");
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
      // The bias riding along (the match checked its rule and types are the weight's).
      const auto bias_of = [&](auto w_tag) {
        using W = decltype(w_tag);
        TileBias<Rule, W> bias;
        if (nodes.bias_update < 0) return bias;
        const Node& bias_update = g.node(nodes.bias_update);
        const UpdateInputs b = *update_inputs(bias_update);
        bias.bias = static_cast<W*>(c.ptr(b.param));
        bias.state = state_slots(b, [&](ValueId v) { return c.ptr(v); });
        bias.scalars = c.update_scalars(bias_update.id);
        with_update_rule(bias_update, [&](auto, auto bias_hyper) {
          if constexpr (std::is_same_v<decltype(bias_hyper), HyperOf<Rule>>) bias.hyper = bias_hyper;
        });
        return bias;
      };
      if (w.dtype == DType::f16)
        run = [=, bias = bias_of(__half{})](cudaStream_t s) {
          launch_wgrad_update<Rule, __half, __half>(dy, x, batch, n, k, static_cast<__half*>(wp), state, scalars, step,
                                                    hyper, s, dependent, bias);
        };
      else if (grad == DType::f16)
        run = [=, bias = bias_of(float{})](cudaStream_t s) {
          launch_wgrad_update<Rule, float, __half>(dy, x, batch, n, k, static_cast<float*>(wp), state, scalars, step,
                                                   hyper, s, dependent, bias);
        };
      else
        run = [=, bias = bias_of(float{})](cudaStream_t s) {
          launch_wgrad_update<Rule, float, float>(dy, x, batch, n, k, static_cast<float*>(wp), state, scalars, step,
                                                  hyper, s, dependent, bias);
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
