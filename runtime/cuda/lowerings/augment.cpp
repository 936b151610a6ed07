// Lowering: an augment_images node (issue 37) by our gather kernel
// (ops/cuda/augment.hpp), reading the step from the device step counter.
#include "ops/cuda/augment.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"

namespace sg::cuda {
namespace {

class AugmentLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "augment_images"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    if (unit.fusion_group >= 0 || unit.nodes.size() != 1) return std::nullopt;
    const sg::Graph& g = cover.graph();
    const Node& n = g.node(unit.nodes.front());
    if (n.op != OpKind::augment_images || !is_floating(g.value(n.inputs[0]).dtype)) return std::nullopt;
    return single_unit(unit);
  }

  std::string describe(const sg::Graph& g, const Launch& l) const override {
    const auto& a = g.node(l.nodes.front()).attr<AugmentAttrs>();
    return fmt::format("translate={}{}", a.translate, a.flip ? ",flip" : "");
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const Node& n = g.node(l.nodes.front());
    const auto& a = n.attr<AugmentAttrs>();
    const Shape& s = g.value(n.inputs[0]).shape;
    const AugmentGeometry geometry{s[0], s[1], s[2], s[3], a.translate, a.flip, static_cast<float>(a.fill),
                                   a.seed, a.example_offset};
    const void* x = c.ptr(n.inputs[0]);
    const auto* step = static_cast<const std::int32_t*>(c.ptr(n.inputs[1]));
    void* y = c.ptr(n.outputs[0]);
    std::function<void(cudaStream_t)> run;
    with_float_type(g.value(n.inputs[0]).dtype, [&](auto tag) {
      using T = decltype(tag);
      run = [=](cudaStream_t st) {
        launch_augment_images(static_cast<const T*>(x), step, geometry, static_cast<T*>(y), st);
      };
    });
    return std::make_unique<BoundLaunch>(std::move(run));
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_augment_lowering() { return std::make_unique<AugmentLowering>(); }

}  // namespace sg::cuda
