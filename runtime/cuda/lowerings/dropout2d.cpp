// Lowering: a lone dropout2d or dropout2d_backward node by our Philox kernel
// (ops/cuda/dropout2d.hpp): whole channels kept or zeroed, the step read from
// the device step counter so each graph replay draws a new mask; the
// backward recomputes the forward's mask. (Next to a max-pool, the pooling
// lowerings take them into their launch first.)
#include "ops/cuda/dropout2d.hpp"

#include "runtime/cuda/lowerings/lowering_support.hpp"

namespace sg::cuda {
namespace {

class Dropout2dLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "dropout2d"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    if (unit.fusion_group >= 0) return std::nullopt;
    const sg::Graph& g = cover.graph();
    const Node& n = g.node(unit.nodes.front());
    if (n.op != OpKind::dropout2d && n.op != OpKind::dropout2d_backward) return std::nullopt;
    const DType x = g.value(n.inputs[0]).dtype;
    if (!is_floating(x) || g.value(n.outputs[0]).dtype != x || g.value(n.inputs[1]).dtype != DType::i32)
      return std::nullopt;
    return single_unit(unit);
  }

  std::string describe(const sg::Graph& g, const Launch& l) const override {
    const auto& a = g.node(l.nodes.front()).attr<DropoutAttrs>();
    return fmt::format("p={:.3g},stream={}{}", a.p, a.stream, a.channels_last ? ",channels_last" : "");
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const Node& n = g.node(l.nodes.front());
    const auto& a = n.attr<DropoutAttrs>();
    const DropoutParams params = dropout_params_of(a);
    const Value& x = g.value(n.inputs[0]);
    const Shape& d = x.shape;  // [N,C,H,W], or [N,H,W,C] channels-last
    const Dropout2dShape shape = a.channels_last ? Dropout2dShape{d[0], d[3], d[1] * d[2], true}
                                                 : Dropout2dShape{d[0], d[1], d[2] * d[3], false};
    const void* in = c.ptr(x.id);
    const auto* step = static_cast<const std::int32_t*>(c.ptr(n.inputs[1]));
    void* out = c.ptr(n.outputs[0]);
    std::function<void(cudaStream_t)> run;
    with_float_type(x.dtype, [&](auto tag) {
      using T = decltype(tag);
      run = [=](cudaStream_t s) {
        launch_dropout2d(static_cast<const T*>(in), step, shape, params, static_cast<T*>(out), s);
      };
    });
    return std::make_unique<BoundLaunch>(std::move(run), std::string(op_name(n.op)));
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_dropout2d_lowering() { return std::make_unique<Dropout2dLowering>(); }

}  // namespace sg::cuda
