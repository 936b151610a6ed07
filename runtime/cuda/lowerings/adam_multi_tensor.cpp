// Lowering: every Adam/AdamW update left (the weights': their gradients come
// from cuBLASLt wgrads into buffers; with clipping also the biases') in ONE
// launch, each block one pass over a chunk of one parameter: read W, m, v and
// the gradient, write W, m, v (ops/cuda/optimizer_kernels.hpp). The optimizer
// pass places Adam's updates after the last gradient, so the launch sits where
// all its inputs exist. It takes the step advance as a rider: the last block
// to finish increments the counter after every block has read it.
#include "ops/cuda/optimizer_kernels.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"
#include "runtime/cuda/lowerings/optimizer_support.hpp"

namespace sg::cuda {
namespace {

struct AdamNodes {
  std::vector<NodeId> updates;
};

// Whether two adam_update nodes can share a launch: same attributes, step,
// clip scale and element types.
bool same_launch(const sg::Graph& g, const Node& a, const Node& b) {
  const bool a_scaled = a.inputs.size() == 6, b_scaled = b.inputs.size() == 6;
  return a.attr<AdamUpdateAttrs>() == b.attr<AdamUpdateAttrs>() && a.inputs[4] == b.inputs[4] &&
         a_scaled == b_scaled && (!a_scaled || a.inputs[5] == b.inputs[5]) &&
         g.value(a.inputs[0]).dtype == g.value(b.inputs[0]).dtype &&
         g.value(a.inputs[1]).dtype == g.value(b.inputs[1]).dtype;
}

class AdamMultiTensorLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "adam_multi_tensor"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    const sg::Graph& g = cover.graph();
    if (unit.fusion_group >= 0) return std::nullopt;
    const Node& first = g.node(unit.nodes.front());
    if (first.op != OpKind::adam_update ||
        !update_types_supported(g.value(first.inputs[0]).dtype, g.value(first.inputs[1]).dtype))
      return std::nullopt;
    Match m;
    AdamNodes nodes;
    for (const CoverUnit& u : cover.units()) {
      if (cover.taken(u.id) || u.fusion_group >= 0) continue;
      const Node& n = g.node(u.nodes.front());
      if (n.op != OpKind::adam_update || !same_launch(g, first, n)) continue;
      m.units.push_back(u.id);
      nodes.updates.push_back(n.id);
    }
    m.detail = nodes;
    return m;
  }

  bool takes_rider(const sg::Graph& g, const Launch&, const Launch& rider) const override {
    return rider.nodes.size() == 1 && g.node(rider.nodes[0]).op == OpKind::advance_step;
  }

  std::string describe(const sg::Graph&, const Launch& l) const override {
    return fmt::format("{} tensors,one pass each", detail_of<AdamNodes>(l).updates.size());
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto& nodes = detail_of<AdamNodes>(l).updates;
    const Node& first = g.node(nodes.front());
    const SgdScalars* scalars = c.sgd_scalars(first.id);  // every update's lr is the same run state
    const auto* step = static_cast<const std::int32_t*>(c.ptr(first.inputs[4]));
    const auto* scale = first.inputs.size() == 6 ? static_cast<const float*>(c.ptr(first.inputs[5])) : nullptr;
    std::int32_t* advance = nullptr;
    for (NodeId r : l.riders) advance = static_cast<std::int32_t*>(c.ptr(g.node(r).inputs[0]));
    const bool dependent = c.options().dependent_launch;
    std::function<void(cudaStream_t)> run;
    with_update_types(g.value(first.inputs[0]).dtype, g.value(first.inputs[1]).dtype, [&](auto wt, auto gt) {
      using W = decltype(wt);
      using G = decltype(gt);
      std::vector<AdamTensor<W, G>> tensors;
      for (NodeId id : nodes) {
        const Node& n = g.node(id);
        tensors.push_back({static_cast<W*>(c.ptr(n.inputs[0])), static_cast<const G*>(c.ptr(n.inputs[1])),
                           static_cast<float*>(c.ptr(n.inputs[2])), static_cast<float*>(c.ptr(n.inputs[3])),
                           element_count(g.value(n.inputs[0]).shape)});
      }
      auto kernel = std::make_shared<AdamMultiTensor<W, G>>(tensors, hyper_of(first.attr<AdamUpdateAttrs>()));
      run = [=](cudaStream_t s) { kernel->launch(scalars, step, scale, advance, s, dependent); };
    });
    return std::make_unique<BoundLaunch>(std::move(run), "multi-tensor");
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_adam_multi_tensor_lowering() { return std::make_unique<AdamMultiTensorLowering>(); }

}  // namespace sg::cuda
