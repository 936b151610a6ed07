// Lowering: a bias gradient (column sums of dY) fused with its SGD update,
// one kernel and no gradient buffer (ops/cuda/sgd.cu). It also takes the
// step advance as a rider: the counter then moves with the step's last
// bias update instead of a launch of its own.
#include "runtime/cuda/lowerings/lowering_support.hpp"

namespace sg::cuda {
namespace {

struct BiasNodes {
  NodeId reduce = -1, sgd = -1;
};

class BiasGradSgdLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "bias_grad_sgd"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    const sg::Graph& g = cover.graph();
    if (!cover.is_group(unit, FusionKind::bgrad_sgd)) return std::nullopt;
    BiasNodes nodes{node_of(g, unit, OpKind::reduce_rows), node_of(g, unit, OpKind::sgd_update)};
    const DType dy = g.value(g.node(nodes.reduce).inputs[0]).dtype;
    const DType bias = g.value(g.node(nodes.sgd).inputs[0]).dtype;
    // The bias in the gradient's dtype, or fp32 master biases with f16 / bf16 gradients.
    const bool supported = (bias == dy && is_floating(dy)) || (bias == DType::f32 && is_half_width_float(dy));
    if (!supported) return std::nullopt;
    Match m = single_unit(unit);
    m.detail = nodes;
    return m;
  }

  bool takes_rider(const sg::Graph& g, const Launch&, const Launch& rider) const override {
    return rider.nodes.size() == 1 && g.node(rider.nodes[0]).op == OpKind::advance_step;
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto& nodes = detail_of<BiasNodes>(l);
    const Node& reduce = g.node(nodes.reduce);
    const Node& sgd = g.node(nodes.sgd);
    const Value& dy = g.value(reduce.inputs[0]);
    const Value& bias = g.value(sgd.inputs[0]);
    void* velocity = sgd.inputs.size() == 3 ? c.ptr(sgd.inputs[2]) : nullptr;
    const UpdateScalars* scalars = c.update_scalars(sgd.id);
    std::int32_t* advance = nullptr;
    for (NodeId r : l.riders) advance = static_cast<std::int32_t*>(c.ptr(g.node(r).inputs[0]));
    const void* dy_p = c.ptr(dy.id);
    void* b = c.ptr(bias.id);
    const auto rows = dy.shape[0], cols = dy.shape[1];
    const bool dependent = c.options().dependent_launch;
    std::function<void(cudaStream_t)> run;
    with_float_type(dy.dtype, [&](auto tag) {
      using G = decltype(tag);
      if (bias.dtype == dy.dtype)
        run = [=](cudaStream_t s) {
          launch_bias_grad_sgd(static_cast<const G*>(dy_p), rows, cols, static_cast<G*>(b), static_cast<G*>(velocity),
                               scalars, s, dependent, advance);
        };
      else  // fp32 master bias
        run = [=](cudaStream_t s) {
          launch_bias_grad_sgd(static_cast<const G*>(dy_p), rows, cols, static_cast<float*>(b),
                               static_cast<float*>(velocity), scalars, s, dependent, advance);
        };
    });
    return std::make_unique<BoundLaunch>(std::move(run));
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_bias_grad_sgd_lowering() { return std::make_unique<BiasGradSgdLowering>(); }

}  // namespace sg::cuda
