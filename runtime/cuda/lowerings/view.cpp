// Lowering: a reshape or flatten node as a view: its output is its input's
// bytes under another shape (both NCHW/row-major contiguous), and so is a
// layout conversion (to_channels_last / to_channels_first) of a value with one
// channel or a 1x1 plane, whose element order it keeps; so the memory
// plan gives the two one buffer (Launch::aliases) and the launch enqueues no
// kernel. An input the graph owns (a parameter, the dataset) has no arena
// buffer to share and is not taken.
#include "graph/channels_last_pass.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"

namespace sg::cuda {
namespace {

class ViewLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "view"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    if (unit.fusion_group >= 0) return std::nullopt;
    const sg::Graph& g = cover.graph();
    const Node& n = g.node(unit.nodes.front());
    const Value& in = g.value(n.inputs[0]);
    if (n.op == OpKind::to_channels_last || n.op == OpKind::to_channels_first) {
      const Shape& s = in.shape;  // [N,C,H,W] or [N,H,W,C]
      const std::int64_t c = n.op == OpKind::to_channels_last ? s[1] : s[3];
      if (!layout_conversion_is_view(c, s[1] * s[2] * s[3] / c)) return std::nullopt;
    } else if (n.op != OpKind::reshape && n.op != OpKind::flatten) {
      return std::nullopt;
    }
    if (is_graph_owned(in.role) || is_graph_owned(g.value(n.outputs[0]).role)) return std::nullopt;
    Match m = single_unit(unit);
    m.aliases.emplace_back(n.outputs[0], n.inputs[0]);
    return m;
  }

  std::string describe(const sg::Graph&, const Launch&) const override { return "no kernel"; }

  std::unique_ptr<RecordedLaunch> record(const Launch&, std::size_t, const BindContext&) const override {
    return std::make_unique<BoundLaunch>([](cudaStream_t) {}, "no kernel: the output aliases the input");
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_view_lowering() { return std::make_unique<ViewLowering>(); }

}  // namespace sg::cuda
