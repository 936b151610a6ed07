// Lowering: a layer's weight-gradient matmul (dY^T X, fp16 inputs) [+ the
// cast of its output to fp32 master weights] fused with the weight's
// Adam/AdamW update: each tile of the gradient goes straight from the
// accumulators into the update (ops/cuda/wgrad_adam.hpp), with no gradient
// buffer and no pass of its own. The launch runs where the matmul sits, so
// every other reader of W (its forward, its dgrad) must come before it; the
// step counter is read before its advance (which stays with the remaining
// updates). Not with clipping: the clip scale exists only after every
// gradient (adam_update then has a sixth input, and adam_multi_tensor takes it).
#include "ops/cuda/wgrad_adam.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"
#include "runtime/cuda/lowerings/optimizer_support.hpp"

namespace sg::cuda {
namespace {

// Where it runs (measured on the H100 against the buffered path, cuBLASLt's
// weight gradients + adam_multi_tensor, graph replay of 784-H-H-10 AdamW):
// with fp32 master weights at H = 1024, batch 128 it takes the step from
// 81.1 to 77.9 us (no f16 gradient buffer, no widening cast, no second pass
// over W); with fp16 weights it is slower (batch 128: 67.4 vs 59.7 us, 256:
// 71.9 vs 61.3; the buffered path then moves only 17% more bytes and the
// multi-tensor pass streams them at 3 TB/s, this kernel at ~1.6), and at
// H = 8192, batch 256 its wmma tiles are compute-bound (1200.6 vs 805.3 us).
// So: fp32 master weights, batch <= 128, W up to 1024 x 1024 elements.
constexpr std::int64_t kMaxBatch = 128;
constexpr std::int64_t kMaxWeightElements = 1024 * 1024;

struct WgradAdamNodes {
  NodeId matmul = -1, cast = -1, update = -1;
};

bool is_graph_output(const sg::Graph& g, ValueId v) {
  return std::find(g.outputs().begin(), g.outputs().end(), v) != g.outputs().end();
}

// The one node reading `v` (not a graph output), else -1.
NodeId sole_reader(const sg::Graph& g, ValueId v) {
  const auto readers = g.consumers(v);
  return readers.size() == 1 && !is_graph_output(g, v) ? readers[0] : -1;
}

// The free unit holding exactly `node` and nothing else.
const CoverUnit* free_lone_unit(const Cover& cover, NodeId node) {
  const CoverUnit& u = cover.unit_of(node);
  return !cover.taken(u.id) && u.fusion_group < 0 && u.nodes.size() == 1 ? &u : nullptr;
}

class WgradAdamLowering final : public CudaLowering {
 public:
  explicit WgradAdamLowering(const BackendOptions& options) : options_(options) {}
  std::string_view name() const override { return "wgrad_adam"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    const sg::Graph& g = cover.graph();
    if (options_.accumulate_f16 || unit.fusion_group >= 0 || unit.nodes.size() != 1) return std::nullopt;
    const Node& mm = g.node(unit.nodes.front());
    if (mm.op != OpKind::matmul) return std::nullopt;
    const auto& attrs = mm.attr<MatmulAttrs>();
    const Value& dy = g.value(mm.inputs[0]);
    const Value& x = g.value(mm.inputs[1]);
    const Value& grad = g.value(mm.outputs[0]);
    if (!attrs.trans_a || attrs.trans_b || dy.dtype != DType::f16 || x.dtype != DType::f16 ||
        (grad.dtype != DType::f16 && grad.dtype != DType::f32))
      return std::nullopt;
    WgradAdamNodes nodes{mm.id, -1, -1};
    Match m = single_unit(unit);
    NodeId reader = sole_reader(g, grad.id);
    DType update_grad = grad.dtype;
    if (reader >= 0 && g.node(reader).op == OpKind::cast) {  // fp32 master weights: the f16 gradient widened
      const Node& cast = g.node(reader);
      const CoverUnit* cast_unit = free_lone_unit(cover, cast.id);
      update_grad = g.value(cast.outputs[0]).dtype;
      if (!cast_unit || grad.dtype != DType::f16 || update_grad != DType::f32) return std::nullopt;
      nodes.cast = cast.id;
      m.units.push_back(cast_unit->id);
      reader = sole_reader(g, cast.outputs[0]);
    }
    if (reader < 0) return std::nullopt;
    const Node& update = g.node(reader);
    const CoverUnit* update_unit = free_lone_unit(cover, update.id);
    if (update.op != OpKind::adam_update || update.inputs.size() != 5 || !update_unit ||
        update.inputs[1] != (nodes.cast >= 0 ? g.node(nodes.cast).outputs[0] : grad.id))
      return std::nullopt;
    const Value& w = g.value(update.inputs[0]);
    const bool types_ok = (w.dtype == DType::f16 && update_grad == DType::f16) ||
                          (w.dtype == DType::f32 && update_grad == DType::f32);
    if (!types_ok || w.shape != grad.shape || g.value(update.inputs[2]).dtype != DType::f32 ||
        g.value(update.inputs[3]).dtype != DType::f32)
      return std::nullopt;
    // W changes where the matmul sits: every other reader must come before it.
    for (NodeId r : g.consumers(w.id))
      if (r != update.id && r > mm.id) return std::nullopt;
    if (!wgrad_adam_unsupported(dy.shape[0], w.shape[0], w.shape[1]).empty()) return std::nullopt;
    if (w.dtype != DType::f32 || dy.shape[0] > kMaxBatch || w.shape[0] * w.shape[1] > kMaxWeightElements)
      return std::nullopt;  // where the buffered path measured faster (above)
    nodes.update = update.id;
    m.units.push_back(update_unit->id);
    m.detail = nodes;
    return m;
  }

  std::string describe(const sg::Graph& g, const Launch& l) const override {
    const auto& nodes = detail_of<WgradAdamNodes>(l);
    return fmt::format("tile into {}{}", g.node(nodes.update).attr<AdamUpdateAttrs>().decoupled ? "adamw" : "adam",
                       nodes.cast >= 0 ? ",fp32 master" : "");
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto& nodes = detail_of<WgradAdamNodes>(l);
    const Node& mm = g.node(nodes.matmul);
    const Node& update = g.node(nodes.update);
    const Value& w = g.value(update.inputs[0]);
    const auto* dy = static_cast<const __half*>(c.ptr(mm.inputs[0]));
    const auto* x = static_cast<const __half*>(c.ptr(mm.inputs[1]));
    const std::int64_t batch = g.value(mm.inputs[0]).shape[0], n = w.shape[0], k = w.shape[1];
    void* wp = c.ptr(w.id);
    auto* m = static_cast<float*>(c.ptr(update.inputs[2]));
    auto* v = static_cast<float*>(c.ptr(update.inputs[3]));
    const auto* step = static_cast<const std::int32_t*>(c.ptr(update.inputs[4]));
    const SgdScalars* scalars = c.sgd_scalars(update.id);
    const AdamHyper hyper = hyper_of(update.attr<AdamUpdateAttrs>());
    const bool dependent = c.options().dependent_launch;
    const DType grad = g.value(mm.outputs[0]).dtype;  // what the matmul would have written
    std::function<void(cudaStream_t)> run;
    if (w.dtype == DType::f16)
      run = [=](cudaStream_t s) {
        launch_wgrad_adam<__half, __half>(dy, x, batch, n, k, static_cast<__half*>(wp), m, v, scalars, step, hyper, s,
                                          dependent);
      };
    else if (grad == DType::f16)
      run = [=](cudaStream_t s) {
        launch_wgrad_adam<float, __half>(dy, x, batch, n, k, static_cast<float*>(wp), m, v, scalars, step, hyper, s,
                                         dependent);
      };
    else
      run = [=](cudaStream_t s) {
        launch_wgrad_adam<float, float>(dy, x, batch, n, k, static_cast<float*>(wp), m, v, scalars, step, hyper, s,
                                        dependent);
      };
    return std::make_unique<BoundLaunch>(std::move(run), "tensor-core tile");
  }

 private:
  BackendOptions options_;
};

}  // namespace

std::unique_ptr<CudaLowering> make_wgrad_adam_lowering(const BackendOptions& options) {
  return std::make_unique<WgradAdamLowering>(options);
}

}  // namespace sg::cuda
