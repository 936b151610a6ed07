// Lowering: a to_channels_last or to_channels_first node that moves data
// (the view lowering takes those that do not) by a tiled transpose of each
// image's [C, H*W] matrix (ops/cuda/channels_last.hpp).
#include "ops/cuda/channels_last.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"

namespace sg::cuda {
namespace {

class ChannelsPermuteLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "channels_permute"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    if (unit.fusion_group >= 0) return std::nullopt;
    const sg::Graph& g = cover.graph();
    const Node& n = g.node(unit.nodes.front());
    if (n.op != OpKind::to_channels_last && n.op != OpKind::to_channels_first) return std::nullopt;
    if (!is_floating(g.value(n.inputs[0]).dtype)) return std::nullopt;
    return single_unit(unit);
  }

  std::string describe(const sg::Graph& g, const Launch& l) const override {
    const Node& n = g.node(l.nodes.front());
    if (n.op == OpKind::to_channels_first) return "NHWC->NCHW";
    // A filter's copy (graph/filter_layout_pass.hpp): its input is a parameter or a parameter's cast.
    const Value& in = g.value(n.inputs[0]);
    const bool filter = in.role == Role::param || (in.producer >= 0 && param_cast_to(g, g.node(in.producer)));
    return filter ? "filter [O,C,KH,KW]->[O,KH,KW,C]" : "NCHW->NHWC";
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const Node& n = g.node(l.nodes.front());
    const Value& in = g.value(n.inputs[0]);
    const bool to_last = n.op == OpKind::to_channels_last;
    const Shape& s = in.shape;
    const std::int64_t images = s[0], channels = to_last ? s[1] : s[3];
    const std::int64_t plane = to_last ? s[2] * s[3] : s[1] * s[2];
    const void* x = c.ptr(in.id);
    void* y = c.ptr(n.outputs[0]);
    std::function<void(cudaStream_t)> run;
    with_float_type(in.dtype, [&](auto tag) {
      using T = decltype(tag);
      run = [=](cudaStream_t st) {
        launch_channels_permute(static_cast<const T*>(x), images, channels, plane, to_last, static_cast<T*>(y), st);
      };
    });
    return std::make_unique<BoundLaunch>(std::move(run));
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_channels_permute_lowering() { return std::make_unique<ChannelsPermuteLowering>(); }

}  // namespace sg::cuda
