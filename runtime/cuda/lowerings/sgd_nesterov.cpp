// Lowering: a lone Nesterov SGD update (PyTorch's SGD(nesterov=True)); the
// fusion pass never groups these with their gradient's matmul, and the fp16
// SGD fast lowerings take only plain or momentum updates.
#include "ops/cuda/optimizer_kernels.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"
#include "runtime/cuda/lowerings/optimizer_support.hpp"

namespace sg::cuda {
namespace {

class SgdNesterovLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "sgd_nesterov"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    const sg::Graph& g = cover.graph();
    if (unit.fusion_group >= 0) return std::nullopt;
    const Node& n = g.node(unit.nodes.front());
    if (n.op != OpKind::sgd_update || !n.attr<SgdUpdateAttrs>().nesterov || n.inputs.size() != 3) return std::nullopt;
    const DType w = g.value(n.inputs[0]).dtype;
    if (!update_types_supported(w, g.value(n.inputs[1]).dtype) || g.value(n.inputs[2]).dtype != w) return std::nullopt;
    return single_unit(unit);
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const Node& n = g.node(l.nodes.front());
    void* w = c.ptr(n.inputs[0]);
    const void* grad = c.ptr(n.inputs[1]);
    void* v = c.ptr(n.inputs[2]);
    const auto count = element_count(g.value(n.inputs[0]).shape);
    const UpdateScalars* scalars = c.update_scalars(n.id);
    std::function<void(cudaStream_t)> run;
    with_update_types(g.value(n.inputs[0]).dtype, g.value(n.inputs[1]).dtype, [&](auto wt, auto gt) {
      using W = decltype(wt);
      using G = decltype(gt);
      run = [=](cudaStream_t s) {
        launch_sgd_nesterov(static_cast<W*>(w), static_cast<const G*>(grad), static_cast<W*>(v), count, scalars, s);
      };
    });
    return std::make_unique<BoundLaunch>(std::move(run));
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_sgd_nesterov_lowering() { return std::make_unique<SgdNesterovLowering>(); }

}  // namespace sg::cuda
