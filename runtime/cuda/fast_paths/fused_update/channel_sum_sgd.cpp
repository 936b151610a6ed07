// Lowering: a convolution's bias gradient (channel_sum of dY) fused with its
// SGD update, through an f16/bf16 -> f32 cast where the bias is an fp32
// master: one kernel and no gradient buffer (ops/cuda/channel_sum.hpp), as
// bias_grad_sgd does for a linear layer's reduce_rows. The fusion pass makes
// no group of these, so it gathers the lone channel_sum [-> cast] ->
// sgd_update nodes itself, when the sum and the cast have no other reader.
#include "ops/cuda/channel_sum.hpp"
#include "runtime/cuda/lowerings/lone_units.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"

namespace sg::cuda {
namespace {

struct ChannelSumSgdNodes {
  NodeId sum = -1, cast = -1, sgd = -1;
};

// The only reader of `v`, when it has exactly one and its unit is lone and free.
NodeId only_free_reader(const Cover& cover, ValueId v) {
  const auto readers = cover.graph().consumers(v);
  if (readers.size() != 1 || !free_lone_unit(cover, readers[0])) return -1;
  return readers[0];
}

class ChannelSumSgdLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "channel_sum_sgd"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    if (unit.fusion_group >= 0) return std::nullopt;
    const sg::Graph& g = cover.graph();
    const Node& sum = g.node(unit.nodes.front());
    if (sum.op != OpKind::channel_sum || is_graph_output(g, sum.outputs[0])) return std::nullopt;
    if (g.value(sum.inputs[0]).shape[1] > 65535) return std::nullopt;  // a grid row per channel
    ChannelSumSgdNodes nodes;
    nodes.sum = sum.id;
    ValueId grad = sum.outputs[0];
    NodeId next = only_free_reader(cover, grad);
    if (next >= 0 && g.node(next).op == OpKind::cast) {
      nodes.cast = next;
      grad = g.node(next).outputs[0];
      if (is_graph_output(g, grad)) return std::nullopt;
      next = only_free_reader(cover, grad);
    }
    if (next < 0) return std::nullopt;
    const Node& sgd = g.node(next);
    if (sgd.op != OpKind::sgd_update || sgd.attr<SgdUpdateAttrs>().nesterov || sgd.inputs[1] != grad)
      return std::nullopt;
    nodes.sgd = sgd.id;
    // The bias in the gradient's dtype, or an fp32 master bias with f16 / bf16 gradients.
    const DType dy = g.value(sum.inputs[0]).dtype, bias = g.value(sgd.inputs[0]).dtype;
    const bool supported = (bias == dy && is_floating(dy)) || (bias == DType::f32 && is_half_width_float(dy));
    if (!supported || g.value(grad).dtype != bias) return std::nullopt;
    Match m = single_unit(unit);
    if (nodes.cast >= 0) m.units.push_back(cover.unit_of(nodes.cast).id);
    m.units.push_back(cover.unit_of(nodes.sgd).id);
    m.detail = nodes;
    return m;
  }

  std::string describe(const sg::Graph&, const Launch& l) const override {
    return detail_of<ChannelSumSgdNodes>(l).cast >= 0 ? "+cast" : "";
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto& nodes = detail_of<ChannelSumSgdNodes>(l);
    const Node& sum = g.node(nodes.sum);
    const Node& sgd = g.node(nodes.sgd);
    const Value& dy = g.value(sum.inputs[0]);
    const Value& bias = g.value(sgd.inputs[0]);
    const std::int64_t n = dy.shape[0], channels = dy.shape[1], plane = dy.shape[2] * dy.shape[3];
    const void* dy_p = c.ptr(dy.id);
    void* b = c.ptr(bias.id);
    void* velocity = sgd.inputs.size() == 3 ? c.ptr(sgd.inputs[2]) : nullptr;
    const UpdateScalars* scalars = c.update_scalars(sgd.id);
    auto kernel = std::make_shared<const ChannelSum>(n, channels, plane);
    std::function<void(cudaStream_t)> run;
    with_float_type(dy.dtype, [&](auto tag) {
      using G = decltype(tag);
      if (bias.dtype == dy.dtype)
        run = [=](cudaStream_t s) {
          kernel->sum_sgd(static_cast<const G*>(dy_p), static_cast<G*>(b), static_cast<G*>(velocity), scalars, s);
        };
      else  // fp32 master bias
        run = [=](cudaStream_t s) {
          kernel->sum_sgd(static_cast<const G*>(dy_p), static_cast<float*>(b), static_cast<float*>(velocity), scalars,
                          s);
        };
    });
    return std::make_unique<BoundLaunch>(std::move(run), fmt::format("{} blocks per channel", kernel->slices()));
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_channel_sum_sgd_lowering() { return std::make_unique<ChannelSumSgdLowering>(); }

}  // namespace sg::cuda
