// Lowering: clip_grad_norm_'s factor over every gradient in one launch
// (partial sums of squares per block, the last block adds them in order and
// writes the scale): nothing goes to the host (ops/cuda/optimizer_kernels.hpp).
#include "ops/cuda/optimizer_kernels.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"
#include "runtime/cuda/lowerings/optimizer_support.hpp"

namespace sg::cuda {
namespace {

class GradClipScaleLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "grad_clip_scale"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    const sg::Graph& g = cover.graph();
    if (unit.fusion_group >= 0) return std::nullopt;
    const Node& n = g.node(unit.nodes.front());
    if (n.op != OpKind::grad_clip_scale) return std::nullopt;
    for (ValueId v : n.inputs)
      if (clip_type(g.value(v).dtype) < 0) return std::nullopt;
    return single_unit(unit);
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const Node& n = g.node(l.nodes.front());
    std::vector<ClipInput> inputs;
    for (ValueId v : n.inputs)
      inputs.push_back({c.ptr(v), element_count(g.value(v).shape), clip_type(g.value(v).dtype)});
    auto kernel = std::make_shared<ClipScale>(inputs, float(n.attr<ClipGradAttrs>().max_norm));
    auto* scale = static_cast<float*>(c.ptr(n.outputs[0]));
    return std::make_unique<BoundLaunch>([=](cudaStream_t s) { kernel->launch(scale, s); }, "global norm");
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_grad_clip_scale_lowering() { return std::make_unique<GradClipScaleLowering>(); }

}  // namespace sg::cuda
