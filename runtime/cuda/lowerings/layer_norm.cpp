// Lowering: a layer_norm node, and a layer_norm_backward node, by our
// row kernels (ops/cuda/layer_norm.hpp); gamma and beta of x's type (the
// model casts fp32 master parameters before the layer). One launch for the
// forward, one for the backward (its dx pass and its column sums for dgamma
// and dbeta are two kernels of that launch). A gradient nothing reads is not
// written.
#include "ops/cuda/layer_norm.hpp"
#include "runtime/cuda/lowerings/lone_units.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"

namespace sg::cuda {
namespace {

class LayerNormLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "layer_norm"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    if (unit.fusion_group >= 0 || unit.nodes.size() != 1) return std::nullopt;
    const sg::Graph& g = cover.graph();
    const Node& n = g.node(unit.nodes.front());
    if (n.op != OpKind::layer_norm && n.op != OpKind::layer_norm_backward) return std::nullopt;
    const DType t = g.value(n.inputs[0]).dtype;
    if (!is_floating(t)) return std::nullopt;
    for (ValueId v : n.inputs)
      if (g.value(v).dtype != t) return std::nullopt;
    return single_unit(unit);
  }

  std::string describe(const sg::Graph& g, const Launch& l) const override {
    const Node& n = g.node(l.nodes.front());
    return n.op == OpKind::layer_norm_backward ? "backward" : "";
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const Node& n = g.node(l.nodes.front());
    const bool forward = n.op == OpKind::layer_norm;
    const Shape& x_shape = g.value(n.inputs[forward ? 0 : 1]).shape;
    const std::int64_t rows = x_shape[0], d = element_count(x_shape) / std::max<std::int64_t>(rows, 1);
    const auto eps = static_cast<float>(n.attr<LayerNormAttrs>().eps);
    auto out_ptr = [&](ValueId v) { return launch_writes(l, v) ? c.ptr(v) : nullptr; };
    std::vector<const void*> in;
    for (ValueId v : n.inputs) in.push_back(c.ptr(v));
    std::vector<void*> out;
    for (ValueId v : n.outputs) out.push_back(forward ? c.ptr(v) : out_ptr(v));
    std::function<void(cudaStream_t)> run;
    auto backward = forward ? nullptr : std::make_shared<const LayerNormBackward>(rows, d, eps);
    with_float_type(g.value(n.inputs[0]).dtype, [&](auto tag) {
      using T = decltype(tag);
      const auto* a = static_cast<const T*>(in[0]);
      const auto* b = static_cast<const T*>(in[1]);
      const auto* gamma_or_beta = static_cast<const T*>(in[2]);
      auto* y = static_cast<T*>(out[0]);
      if (forward) {
        run = [=](cudaStream_t s) { launch_layer_norm_forward(a, b, gamma_or_beta, rows, d, eps, y, s); };
      } else {
        auto* dgamma = static_cast<T*>(out[1]);
        auto* dbeta = static_cast<T*>(out[2]);
        run = [=](cudaStream_t s) { backward->run(a, b, gamma_or_beta, y, dgamma, dbeta, s); };
      }
    });
    return std::make_unique<BoundLaunch>(std::move(run), fmt::format("{} rows of {}", rows, d));
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_layer_norm_lowering() { return std::make_unique<LayerNormLowering>(); }

}  // namespace sg::cuda
