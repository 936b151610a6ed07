// Lowering: every SGD update left (plain, momentum or Nesterov; any
// parameter: conv and linear weights, biases, normalisation scales), with the
// f16/bf16 -> f32 cast of its gradient where the weight is an fp32 master,
// all in ONE multi-tensor launch (ops/cuda/sgd_multi_tensor.hpp). It comes
// after the fused updates (a gradient's producer with its update:
// bias_grad_sgd, fused_update's channel sums and weight gradients), so it
// takes what they leave. The optimizer pass places each update right after
// its gradient, so one launch per update is matched first; each may ride on a
// later one of these (Match::may_ride), and the scheduler's rider pass moves
// them all into the last, where every gradient exists. With `per_bucket`
// (BackendOptions::update_per_bucket, data parallel) an update rides only on
// one whose gradient comes from the same all-reduce bucket: one launch per
// bucket. The to_channels_first that turns a channels-last weight gradient
// back into its parameter's layout folds in as well (gradient_order_fold.hpp).
#include "ops/cuda/sgd_multi_tensor.hpp"
#include "runtime/cuda/lowerings/gradient_order_fold.hpp"
#include "runtime/cuda/lowerings/lone_units.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"
#include "runtime/cuda/lowerings/optimizer_support.hpp"
#include "runtime/cuda/lowerings/update_shard.hpp"
#include "runtime/plan/graph_queries.hpp"

namespace sg::cuda {
namespace {

// One update of the launch: the sgd_update node, and the cast and the
// gradient's to_channels_first folded into it (-1: none).
struct SgdUpdate {
  NodeId sgd = -1, cast = -1, permute = -1;
};

// The updates among a launch's nodes (its own and its riders').
std::vector<SgdUpdate> updates_of(const sg::Graph& g, const std::vector<NodeId>& nodes) {
  std::vector<SgdUpdate> out;
  for (NodeId id : nodes) {
    const Node& n = g.node(id);
    if (n.op != OpKind::sgd_update) continue;
    SgdUpdate u{id, -1, -1};
    const auto taken = [&](NodeId p) { return p >= 0 && std::find(nodes.begin(), nodes.end(), p) != nodes.end(); };
    ValueId read = n.inputs[1];
    if (const NodeId producer = g.value(read).producer; taken(producer) && g.node(producer).op == OpKind::cast) {
      u.cast = producer;
      read = g.node(producer).inputs[0];
    }
    const NodeId producer = g.value(read).producer;
    if (taken(producer) && g.node(producer).op == OpKind::to_channels_first) u.permute = producer;
    out.push_back(u);
  }
  return out;
}

// The gradient an update reads: before its folded to_channels_first and cast, if any.
ValueId read_gradient(const sg::Graph& g, const SgdUpdate& u) {
  return gradient_read(g, g.node(u.sgd).inputs[1], u.cast, u.permute);
}

// (weight, gradient as read) element types of an update.
std::pair<DType, DType> types_of(const sg::Graph& g, const SgdUpdate& u) {
  return {g.value(g.node(u.sgd).inputs[0]).dtype, g.value(read_gradient(g, u)).dtype};
}

class SgdMultiTensorLowering final : public CudaLowering {
 public:
  explicit SgdMultiTensorLowering(bool per_bucket) : per_bucket_(per_bucket) {}
  std::string_view name() const override { return "sgd_multi_tensor"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    if (unit.fusion_group >= 0) return std::nullopt;
    const sg::Graph& g = cover.graph();
    const Node& sgd = g.node(unit.nodes.front());
    if (sgd.op != OpKind::sgd_update) return std::nullopt;
    if (sgd.attr<SgdUpdateAttrs>().nesterov && sgd.inputs.size() != 3) return std::nullopt;  // Nesterov needs v
    const Value& w = g.value(sgd.inputs[0]);
    if (sgd.inputs.size() == 3 && g.value(sgd.inputs[2]).dtype != w.dtype) return std::nullopt;
    Match m = single_unit(unit);
    SgdUpdate u{sgd.id, -1, -1};
    // A cast to the weight's dtype whose only reader is this update folds in
    // (the kernel reads the gradient as it comes and updates in f32).
    const ValueId grad = sgd.inputs[1];
    const NodeId producer = g.value(grad).producer;
    if (const CoverUnit* cast = free_lone_unit(cover, producer);
        cast && g.node(producer).op == OpKind::cast && g.value(grad).dtype == w.dtype &&
        sole_reader(g, grad) == sgd.id) {
      u.cast = producer;
      m.units.push_back(cast->id);
    }
    u.permute = folded_gradient_order(cover, u.cast >= 0 ? g.node(u.cast).inputs[0] : grad,
                                      u.cast >= 0 ? u.cast : sgd.id);
    if (u.permute >= 0) m.units.push_back(cover.unit_of(u.permute).id);
    const auto [wt, gt] = types_of(g, u);
    if (!update_types_supported(wt, gt)) return std::nullopt;
    m.may_ride = true;
    return m;
  }

  // Another launch of this lowering with the same element types joins this
  // one; so does the step advance (the kernel increments the counter once).
  bool takes_rider(const sg::Graph& g, const Launch& launch, const Launch& rider) const override {
    if (rider.nodes.size() == 1 && g.node(rider.nodes[0]).op == OpKind::advance_step) return true;
    if (rider.lowering != this) return false;
    const auto mine = updates_of(g, launch.nodes), theirs = updates_of(g, rider.nodes);
    if (mine.empty() || theirs.empty()) return false;
    const auto types = types_of(g, mine.front());
    const NodeId bucket = reducing_bucket(g, g.node(mine.front().sgd).inputs[1]);
    return std::all_of(theirs.begin(), theirs.end(), [&](const SgdUpdate& u) {
      return types_of(g, u) == types && (!per_bucket_ || reducing_bucket(g, g.node(u.sgd).inputs[1]) == bucket);
    });
  }

  std::string describe(const sg::Graph& g, const Launch& l) const override {
    const auto updates = updates_of(g, l.nodes);
    const auto permuted =
        std::count_if(updates.begin(), updates.end(), [](const SgdUpdate& u) { return u.permute >= 0; });
    return fmt::format("{} tensors{}", updates.size(),
                       permuted > 0 ? fmt::format(",{} gradients read [O,KH,KW,C]", permuted) : "");
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto updates = updates_of(g, l.nodes);
    const auto [wtype, gtype] = types_of(g, updates.front());
    std::int32_t* advance = nullptr;
    for (NodeId r : l.riders)
      if (g.node(r).op == OpKind::advance_step) advance = static_cast<std::int32_t*>(c.ptr(g.node(r).inputs[0]));
    std::function<void(cudaStream_t)> run;
    with_update_types(wtype, gtype, [&](auto wt, auto gt) {
      using W = decltype(wt);
      using G = decltype(gt);
      std::vector<SgdTensor<W, G>> tensors;
      for (const SgdUpdate& u : updates) {
        const Node& sgd = g.node(u.sgd);
        const ValueId grad = read_gradient(g, u);
        const std::int64_t elements = element_count(g.value(sgd.inputs[0]).shape);
        const ElementRange r = update_range(c, grad, elements);
        const GradientOrder order = gradient_order(g, u.permute, r.count, elements, "sgd_multi_tensor", sgd.id);
        tensors.push_back({advanced<W>(c.ptr(sgd.inputs[0]), wtype, r),
                           advanced<const G>(c.ptr(grad), gtype, r),
                           sgd.inputs.size() == 3 ? advanced<W>(c.ptr(sgd.inputs[2]), wtype, r) : nullptr, r.count,
                           c.update_scalars(sgd.id), sgd.attr<SgdUpdateAttrs>().nesterov, order});
      }
      auto kernel = std::make_shared<SgdMultiTensor<W, G>>(tensors);
      run = [=](cudaStream_t s) { kernel->launch(s, advance); };
    });
    return std::make_unique<BoundLaunch>(std::move(run), "multi-tensor");
  }

 private:
  bool per_bucket_;
};

}  // namespace

std::unique_ptr<CudaLowering> make_sgd_multi_tensor_lowering(bool per_bucket) {
  return std::make_unique<SgdMultiTensorLowering>(per_bucket);
}

}  // namespace sg::cuda
