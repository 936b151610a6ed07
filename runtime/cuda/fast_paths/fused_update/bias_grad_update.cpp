// Lowering: a bias gradient (column sums of dY, a lone reduce_rows) [+ the
// cast of the fp16 sums to fp32 master weights] fused with its update by any
// update rule (update_rule_table.hpp), one kernel and no gradient buffer
// (ops/cuda/fast_paths/fused_update/bias_grad_update.hpp). Not with clipping:
// the clip scale exists only after every gradient, so those biases go
// through update_multi_tensor.
#include "ops/cuda/fast_paths/fused_update/bias_grad_update.hpp"
#include "runtime/cuda/lowerings/lone_units.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"
#include "runtime/cuda/lowerings/optimizer_support.hpp"
#include "runtime/cuda/lowerings/update_rule_table.hpp"

namespace sg::cuda {
namespace {

struct BiasUpdateNodes {
  NodeId reduce = -1, cast = -1, update = -1;
};

class BiasGradUpdateLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "bias_grad_update"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    const sg::Graph& g = cover.graph();
    if (unit.fusion_group >= 0) return std::nullopt;
    const Node& reduce = g.node(unit.nodes.front());
    if (reduce.op != OpKind::reduce_rows) return std::nullopt;
    const auto chain = sums_update(cover, reduce);
    if (!chain) return std::nullopt;
    Match m;
    m.units = {unit.id};
    BiasUpdateNodes nodes{reduce.id, -1, -1};
    if (chain->cast_unit) {  // fp32 master weights: the f16 sums widened
      if (g.value(reduce.outputs[0]).dtype != DType::f16 || g.value(chain->grad).dtype != DType::f32)
        return std::nullopt;
      nodes.cast = chain->cast_unit->nodes.front();
      m.units.push_back(chain->cast_unit->id);
    }
    const Node& update = g.node(chain->update_unit->nodes.front());
    if (!update_types_supported(g.value(update.inputs[0]).dtype, g.value(reduce.inputs[0]).dtype)) return std::nullopt;
    nodes.update = update.id;
    m.units.push_back(chain->update_unit->id);
    m.detail = nodes;
    return m;
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto& nodes = detail_of<BiasUpdateNodes>(l);
    const Node& reduce = g.node(nodes.reduce);
    const Node& update = g.node(nodes.update);
    const Value& dy = g.value(reduce.inputs[0]);
    const auto rows = dy.shape[0], cols = dy.shape[1];
    const UpdateInputs in = *update_inputs(update);
    const void* dy_p = c.ptr(dy.id);
    void* bias = c.ptr(in.param);
    const StateSlots state = state_slots(in, [&](ValueId v) { return c.ptr(v); });
    const auto* step = in.step >= 0 ? static_cast<const std::int32_t*>(c.ptr(in.step)) : nullptr;
    const UpdateScalars* scalars = c.update_scalars(update.id);
    const bool dependent = c.options().dependent_launch;
    std::function<void(cudaStream_t)> run;
    with_update_rule(update, [&](auto rule, auto hyper) {
      using Rule = typename decltype(rule)::type;
      with_update_types(g.value(in.param).dtype, dy.dtype, [&](auto wt, auto gt) {
        using W = decltype(wt);
        using G = decltype(gt);
        run = [=](cudaStream_t s) {
          launch_bias_grad_update<Rule>(static_cast<const G*>(dy_p), rows, cols, static_cast<W*>(bias), state, scalars,
                                        step, hyper, s, dependent);
        };
      });
    });
    return std::make_unique<BoundLaunch>(std::move(run));
  }
};

}  // namespace

// (The factory keeps its issue-21 name: runtime/cuda/lowerings/registry.cpp calls it.)
std::unique_ptr<CudaLowering> make_bias_grad_update_lowering() { return std::make_unique<BiasGradUpdateLowering>(); }

}  // namespace sg::cuda
