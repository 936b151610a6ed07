// Lowering: a bias gradient (column sums of dY, a lone reduce_rows) [+ the
// cast of the fp16 sums to fp32 master weights] fused with its Adam/AdamW
// update, one kernel and no gradient buffer (ops/cuda/optimizer_kernels.hpp).
// Not with clipping: the clip scale exists only after every gradient, so
// those biases go through adam_multi_tensor.
#include "ops/cuda/optimizer_kernels.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"
#include "runtime/cuda/lowerings/optimizer_support.hpp"

namespace sg::cuda {
namespace {

struct BiasAdamNodes {
  NodeId reduce = -1, cast = -1, update = -1;
};

// The one reader of `v` when it is not a graph output, else -1.
NodeId sole_reader(const sg::Graph& g, ValueId v) {
  const auto readers = g.consumers(v);
  if (readers.size() != 1 || std::find(g.outputs().begin(), g.outputs().end(), v) != g.outputs().end()) return -1;
  return readers[0];
}

class BiasGradAdamLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "bias_grad_adam"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    const sg::Graph& g = cover.graph();
    if (unit.fusion_group >= 0) return std::nullopt;
    const Node& reduce = g.node(unit.nodes.front());
    if (reduce.op != OpKind::reduce_rows) return std::nullopt;
    Match m;
    m.units = {unit.id};
    BiasAdamNodes nodes{reduce.id, -1, -1};
    ValueId grad = reduce.outputs[0];
    NodeId reader = sole_reader(g, grad);
    if (reader >= 0 && g.node(reader).op == OpKind::cast) {  // fp32 master weights: the f16 sums widened
      const Node& cast = g.node(reader);
      const CoverUnit& cast_unit = cover.unit_of(cast.id);
      if (cover.taken(cast_unit.id) || cast_unit.fusion_group >= 0 || cast_unit.nodes.size() != 1 ||
          g.value(grad).dtype != DType::f16 || g.value(cast.outputs[0]).dtype != DType::f32)
        return std::nullopt;
      nodes.cast = cast.id;
      m.units.push_back(cast_unit.id);
      grad = cast.outputs[0];
      reader = sole_reader(g, grad);
    }
    if (reader < 0) return std::nullopt;
    const Node& update = g.node(reader);
    if (update.op != OpKind::adam_update || update.inputs.size() != 5 || update.inputs[1] != grad) return std::nullopt;
    const CoverUnit& update_unit = cover.unit_of(update.id);
    if (cover.taken(update_unit.id) || update_unit.fusion_group >= 0) return std::nullopt;
    if (!update_types_supported(g.value(update.inputs[0]).dtype, g.value(reduce.inputs[0]).dtype)) return std::nullopt;
    nodes.update = update.id;
    m.units.push_back(update_unit.id);
    m.detail = nodes;
    return m;
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto& nodes = detail_of<BiasAdamNodes>(l);
    const Node& reduce = g.node(nodes.reduce);
    const Node& update = g.node(nodes.update);
    const Value& dy = g.value(reduce.inputs[0]);
    const auto rows = dy.shape[0], cols = dy.shape[1];
    const void* dy_p = c.ptr(dy.id);
    void* bias = c.ptr(update.inputs[0]);
    auto* m = static_cast<float*>(c.ptr(update.inputs[2]));
    auto* v = static_cast<float*>(c.ptr(update.inputs[3]));
    const auto* step = static_cast<const std::int32_t*>(c.ptr(update.inputs[4]));
    const SgdScalars* scalars = c.sgd_scalars(update.id);
    const AdamHyper hyper = hyper_of(update.attr<AdamUpdateAttrs>());
    const bool dependent = c.options().dependent_launch;
    std::function<void(cudaStream_t)> run;
    with_update_types(g.value(update.inputs[0]).dtype, dy.dtype, [&](auto wt, auto gt) {
      using W = decltype(wt);
      using G = decltype(gt);
      run = [=](cudaStream_t s) {
        launch_bias_grad_adam(static_cast<const G*>(dy_p), rows, cols, static_cast<W*>(bias), m, v, scalars, step,
                              hyper, s, dependent);
      };
    });
    return std::make_unique<BoundLaunch>(std::move(run));
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_bias_grad_adam_lowering() { return std::make_unique<BiasGradAdamLowering>(); }

}  // namespace sg::cuda
