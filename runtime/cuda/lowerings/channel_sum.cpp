// Lowering: a channel_sum node that channel_sum_sgd did not fuse with an SGD
// update (Adam, clipping, an extra reader), by our fixed-order reduction
// (ops/cuda/channel_sum.hpp), with the f16/bf16 -> f32 cast after it folded
// in when that cast is its only reader (fp32 master biases: the gradient
// then goes straight to the optimizer in f32) and no update rule reads it
// (update_multi_tensor takes such casts: free_widening_cast).
#include "ops/cuda/channel_sum.hpp"
#include "runtime/cuda/lowerings/lone_units.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"
#include "runtime/cuda/lowerings/update_rule_table.hpp"

namespace sg::cuda {
namespace {

struct ChannelSumNodes {
  NodeId sum = -1, cast = -1;
};

class ChannelSumLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "channel_sum"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    if (unit.fusion_group >= 0) return std::nullopt;
    const sg::Graph& g = cover.graph();
    const Node& n = g.node(unit.nodes.front());
    if (n.op != OpKind::channel_sum) return std::nullopt;
    const DType x = g.value(n.inputs[0]).dtype;
    if (!is_floating(x) || g.value(n.outputs[0]).dtype != x) return std::nullopt;
    if (g.value(n.inputs[0]).shape[1] > 65535) return std::nullopt;  // a grid row per channel
    Match m = single_unit(unit);
    ChannelSumNodes nodes{n.id, -1};
    if (const CoverUnit* cast = free_widening_cast(cover, n.outputs[0])) {
      nodes.cast = cast->nodes.front();
      m.units.push_back(cast->id);
    }
    m.detail = nodes;
    return m;
  }

  std::string describe(const sg::Graph&, const Launch& l) const override {
    return detail_of<ChannelSumNodes>(l).cast >= 0 ? "+cast" : "";
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto& nodes = detail_of<ChannelSumNodes>(l);
    const Node& n = g.node(nodes.sum);
    const Value& x = g.value(n.inputs[0]);
    const std::int64_t batch = x.shape[0], channels = x.shape[1], plane = x.shape[2] * x.shape[3];
    const void* in = c.ptr(x.id);
    void* out = c.ptr(nodes.cast >= 0 ? g.node(nodes.cast).outputs[0] : n.outputs[0]);
    auto kernel = std::make_shared<const ChannelSum>(batch, channels, plane);
    std::function<void(cudaStream_t)> run;
    with_float_type(x.dtype, [&](auto tag) {
      using T = decltype(tag);
      if (nodes.cast >= 0)
        run = [=](cudaStream_t s) { kernel->sum(static_cast<const T*>(in), static_cast<float*>(out), s); };
      else
        run = [=](cudaStream_t s) { kernel->sum(static_cast<const T*>(in), static_cast<T*>(out), s); };
    });
    return std::make_unique<BoundLaunch>(std::move(run), fmt::format("{} blocks per channel", kernel->slices()));
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_channel_sum_lowering() { return std::make_unique<ChannelSumLowering>(); }

}  // namespace sg::cuda
