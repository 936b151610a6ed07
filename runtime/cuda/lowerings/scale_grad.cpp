// Lowering: a gradient times the clip scale (scale_grad), for updates that do
// not read the scale themselves (SGD under clip_grad_norm).
#include "ops/cuda/optimizer_kernels.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"
#include "runtime/cuda/lowerings/optimizer_support.hpp"

namespace sg::cuda {
namespace {

class ScaleGradLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "scale_grad"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    const sg::Graph& g = cover.graph();
    if (unit.fusion_group >= 0) return std::nullopt;
    const Node& n = g.node(unit.nodes.front());
    if (n.op != OpKind::scale_grad || clip_type(g.value(n.inputs[0]).dtype) < 0) return std::nullopt;
    return single_unit(unit);
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const Node& n = g.node(l.nodes.front());
    const Value& x = g.value(n.inputs[0]);
    const void* xp = c.ptr(x.id);
    const auto* scale = static_cast<const float*>(c.ptr(n.inputs[1]));
    void* y = c.ptr(n.outputs[0]);
    const auto count = element_count(x.shape);
    std::function<void(cudaStream_t)> run;
    with_update_types(x.dtype, x.dtype, [&](auto tag, auto) {
      using T = decltype(tag);
      run = [=](cudaStream_t s) { launch_scale_grad(static_cast<const T*>(xp), scale, count, static_cast<T*>(y), s); };
    });
    return std::make_unique<BoundLaunch>(std::move(run));
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_scale_grad_lowering() { return std::make_unique<ScaleGradLowering>(); }

}  // namespace sg::cuda
