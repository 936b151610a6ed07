// Lowering: the mean-pooling nodes (avg_pool2d, global_avg_pool2d and their
// backwards, issue 37) by our kernels (ops/cuda/avg_pooling.hpp), one
// launch each. Nothing is folded in yet: in a residual CNN they sit at the
// end (global pooling before the classifier) or between stages, where a
// launch of a few microseconds is not what the step waits on. avg_pool2d
// and its backward also run channels-last, inside a region.
#include "ops/cuda/avg_pooling.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"

namespace sg::cuda {
namespace {

bool mean_pooling(OpKind op) {
  return op == OpKind::avg_pool2d || op == OpKind::avg_pool2d_backward || op == OpKind::global_avg_pool2d ||
         op == OpKind::global_avg_pool2d_backward;
}

class AvgPool2dLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "avg_pool2d"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    if (unit.fusion_group >= 0 || unit.nodes.size() != 1) return std::nullopt;
    const sg::Graph& g = cover.graph();
    const Node& n = g.node(unit.nodes.front());
    if (!mean_pooling(n.op)) return std::nullopt;
    const DType t = g.value(n.inputs[0]).dtype;
    if (!is_floating(t) || g.value(n.outputs[0]).dtype != t) return std::nullopt;
    return single_unit(unit);
  }

  std::string describe(const sg::Graph& g, const Launch& l) const override {
    const Node& n = g.node(l.nodes.front());
    if (n.op == OpKind::global_avg_pool2d) return "global";
    if (n.op == OpKind::global_avg_pool2d_backward) return "global_backward";
    const auto& a = n.attr<Pool2dAttrs>();
    return fmt::format("{}k={},s={}{}", n.op == OpKind::avg_pool2d_backward ? "backward " : "", a.kernel, a.stride,
                       a.channels_last ? ",channels_last" : "");
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const Node& n = g.node(l.nodes.front());
    const OpKind op = n.op;
    // The [N, C, H, W] side: the input forward, the output backward.
    const bool forward = op == OpKind::avg_pool2d || op == OpKind::global_avg_pool2d;
    const Shape& full = g.value(forward ? n.inputs[0] : n.outputs[0]).shape;
    PoolGeometry geometry{full[0] * full[1], full[2], full[3], 1, 1};
    ChannelsLastPool last;  // [N,H,W,C] sizes when the node is channels-last
    const bool windowed = op == OpKind::avg_pool2d || op == OpKind::avg_pool2d_backward;
    const bool channels_last = windowed && n.attr<Pool2dAttrs>().channels_last;
    if (windowed) {
      geometry.kernel = n.attr<Pool2dAttrs>().kernel;
      geometry.stride = n.attr<Pool2dAttrs>().stride;
      last = {full[0], full[1], full[2], full[3], geometry.kernel, geometry.stride, false};
    }
    const void* in = c.ptr(n.inputs[0]);
    void* out = c.ptr(n.outputs[0]);
    std::function<void(cudaStream_t)> run;
    with_float_type(g.value(n.inputs[0]).dtype, [&](auto tag) {
      using T = decltype(tag);
      const T* x = static_cast<const T*>(in);
      T* y = static_cast<T*>(out);
      const std::int64_t planes = geometry.planes, plane = geometry.h * geometry.w;
      switch (op) {
        case OpKind::avg_pool2d:
          if (channels_last)
            run = [=](cudaStream_t s) { launch_avg_pool2d_nhwc_forward(x, last, y, s); };
          else
            run = [=](cudaStream_t s) { launch_avg_pool2d_forward(x, geometry, y, s); };
          break;
        case OpKind::avg_pool2d_backward:
          if (channels_last)
            run = [=](cudaStream_t s) { launch_avg_pool2d_nhwc_backward(x, last, y, s); };
          else
            run = [=](cudaStream_t s) { launch_avg_pool2d_backward(x, geometry, y, s); };
          break;
        case OpKind::global_avg_pool2d:
          run = [=](cudaStream_t s) { launch_global_avg_pool2d_forward(x, planes, plane, y, s); };
          break;
        default:
          run = [=](cudaStream_t s) { launch_global_avg_pool2d_backward(x, planes, plane, y, s); };
          break;
      }
    });
    return std::make_unique<BoundLaunch>(std::move(run));
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_avg_pool2d_lowering() { return std::make_unique<AvgPool2dLowering>(); }

}  // namespace sg::cuda
