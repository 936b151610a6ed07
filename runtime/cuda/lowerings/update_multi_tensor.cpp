// Lowering: every update-rule update left (Adam/AdamW, RMSprop: the weights'
// when their gradients come from cuBLASLt wgrads into buffers; with clipping
// also the biases') in ONE launch per rule and attributes, each block one pass
// over a chunk of one parameter: read W, the gradient and the rule's state
// slots, write W and the slots (ops/cuda/update_rules/multi_tensor_update.hpp).
// The optimizer pass places these updates after the last gradient, so the
// launch sits where all its inputs exist. It takes the step advance as a
// rider: the last block to finish increments the counter after every block
// has read it. A gradient widened from f16/bf16 to the fp32 master's f32 by
// a cast that nothing else reads is read before the cast instead, the cast
// taken into the launch (widening is exact: the same bits, one launch less);
// so is the to_channels_first before it that turns a channels-last weight
// gradient back into the parameter's layout (gradient_order_fold.hpp).
// With `per_bucket` (BackendOptions::update_per_bucket, data parallel) a
// launch takes only the updates whose gradients come from one all-reduce
// bucket; the step advance rides on the last of them. With
// `large_apart` (BackendOptions::large_updates_apart) an update of 32 MB
// or more whose gradient is complete before the step's last one gets a
// launch of its own, which stays on the gradient stream beside the
// last weight gradients (runs_beside_chain_end). An fp32 master's
// compute copy is written in the same pass for the next step, its cast at
// the step's start taken into the launch (carried_copies.hpp).
#include "ops/cuda/update_rules/multi_tensor_update.hpp"
#include "runtime/cuda/lowerings/carried_copies.hpp"
#include "runtime/cuda/lowerings/gradient_order_fold.hpp"
#include "runtime/cuda/lowerings/lone_units.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"
#include "runtime/cuda/lowerings/optimizer_support.hpp"
#include "runtime/cuda/lowerings/update_rule_table.hpp"
#include "runtime/cuda/lowerings/update_shard.hpp"
#include "runtime/plan/graph_queries.hpp"

namespace sg::cuda {
namespace {

struct UpdateNodes {
  std::vector<NodeId> updates;
  std::vector<NodeId> casts;     // per update: the widening cast taken in, or -1
  std::vector<NodeId> permutes;  // per update: the gradient's to_channels_first taken in, or -1
  std::vector<NodeId> copies;    // per update: the parameter's cast whose output the launch carries, or -1
  bool apart = false;            // one large parameter's update ahead of the last gradient (kApartBytes)
};

// The cast that widens an update's f16/bf16 gradient to its f32 gradient,
// when it is a free lone unit that only this update reads; else -1.
NodeId folded_cast(const Cover& cover, const Node& update) {
  const sg::Graph& g = cover.graph();
  const ValueId grad = update_inputs(update)->grad;
  const NodeId producer = g.value(grad).producer;
  if (producer < 0 || g.node(producer).op != OpKind::cast || !free_lone_unit(cover, producer)) return -1;
  if (g.consumers(grad).size() != 1 || is_graph_output(g, grad) || g.value(grad).dtype != DType::f32) return -1;
  return is_half_width_float(g.value(g.node(producer).inputs[0]).dtype) ? producer : -1;
}

// The gradient the launch reads for an update: before its folded cast, if any.
ValueId read_gradient(const sg::Graph& g, const Node& update, NodeId cast) {
  return cast >= 0 ? g.node(cast).inputs[0] : update_inputs(update)->grad;
}

// The to_channels_first before that gradient the launch takes too, or -1.
NodeId folded_permute(const Cover& cover, const Node& update, NodeId cast) {
  return folded_gradient_order(cover, read_gradient(cover.graph(), update, cast), cast >= 0 ? cast : update.id);
}

// Whether two update-rule nodes can share a launch: same op and attributes,
// step, clip scale and element types (of the gradients read).
bool same_launch(const sg::Graph& g, const Node& a, DType a_grad, const Node& b, DType b_grad) {
  const UpdateInputs ua = *update_inputs(a), ub = *update_inputs(b);
  return a.op == b.op && a.attrs == b.attrs && ua.step == ub.step && ua.clip_scale == ub.clip_scale &&
         g.value(ua.param).dtype == g.value(ub.param).dtype && a_grad == b_grad;
}

// An update that may share the launch, with what the launch takes with it.
struct Candidate {
  int unit = -1;
  NodeId update = -1, cast = -1, permute = -1, copy = -1;
  NodeId gradient_done = -1;  // the node that completes the update's gradient (its widening cast, if any)
  std::int64_t bytes = 0;     // what the update reads and writes
};

// An update that moves this many bytes or more, its gradient complete before
// the step's last one, gets a launch of its own
// (BackendOptions::large_updates_apart): ~8 us at the H200's 4.2 TB/s, which
// the stream plan runs beside the rest of the backward instead of after it.
// Measured (H200, docs/benchmarks.md): 784-2048-2048-10's W2 (126 MB) 109.2
// -> 102.3 us a step, keras_mnist_adam's dense layer (33 MB) 161.6 -> 156.8;
// 784-1024-1024-10's fp16 W2 (23 MB) 50.2 -> 53.8, so not below this.
constexpr std::int64_t kApartBytes = 32'000'000;

// Bytes an update moves: W read and written, the gradient read, each state slot read and written, the copy.
std::int64_t update_bytes(const sg::Graph& g, const Node& update, ValueId grad_read, bool copy) {
  const UpdateInputs u = *update_inputs(update);
  std::int64_t per_element = 2 * static_cast<std::int64_t>(dtype_size(g.value(u.param).dtype)) +
                             static_cast<std::int64_t>(dtype_size(g.value(grad_read).dtype)) + (copy ? 2 : 0);
  for (ValueId slot : u.state)
    if (slot >= 0) per_element += 2 * static_cast<std::int64_t>(dtype_size(g.value(slot).dtype));
  return per_element * element_count(g.value(u.param).shape);
}

class UpdateMultiTensorLowering final : public CudaLowering {
 public:
  UpdateMultiTensorLowering(bool per_bucket, bool large_apart) : per_bucket_(per_bucket), large_apart_(large_apart) {}
  std::string_view name() const override { return "update_multi_tensor"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    const sg::Graph& g = cover.graph();
    if (unit.fusion_group >= 0) return std::nullopt;
    const Node& first = g.node(unit.nodes.front());
    const auto first_inputs = update_inputs(first);
    if (!first_inputs) return std::nullopt;
    const DType first_grad = g.value(read_gradient(g, first, folded_cast(cover, first))).dtype;
    if (!update_types_supported(g.value(first_inputs->param).dtype, first_grad)) return std::nullopt;
    // (A clipped update waits for the clip scale, which reads every gradient: nothing to split.)
    const bool split = per_bucket_ && first_inputs->clip_scale < 0;
    const NodeId bucket = reducing_bucket(g, first.inputs[1]);
    std::vector<Candidate> candidates;
    for (const CoverUnit& u : cover.units()) {
      if (cover.taken(u.id) || u.fusion_group >= 0) continue;
      const Node& n = g.node(u.nodes.front());
      if (n.op != first.op) continue;
      if (split && reducing_bucket(g, n.inputs[1]) != bucket) continue;
      Candidate c{u.id, n.id, folded_cast(cover, n)};
      const ValueId grad_read = read_gradient(g, n, c.cast);
      if (!same_launch(g, first, first_grad, n, g.value(grad_read).dtype)) continue;
      const UpdateInputs in = *update_inputs(n);
      c.permute = folded_permute(cover, n, c.cast);
      c.copy = carried_cast(cover, in.param, grad_read);
      c.gradient_done = g.value(in.grad).producer;
      c.bytes = update_bytes(g, n, gradient_read(g, in.grad, c.cast, c.permute), c.copy >= 0);
      candidates.push_back(c);
    }
    bool apart = false;
    if (large_apart_ && first_inputs->clip_scale < 0) {
      // Over every update of the rule, taken ones too (by the fused updates, or by this lowering's
      // launches matched before: the cover offers units in graph order).
      NodeId last = -1;
      for (const Node& n : g.nodes())
        if (n.op == first.op && (!split || reducing_bucket(g, n.inputs[1]) == bucket))
          last = std::max(last, g.value(update_inputs(n)->grad).producer);
      const auto is_apart = [&](const Candidate& c) { return c.bytes >= kApartBytes && c.gradient_done < last; };
      const auto offered =
          std::find_if(candidates.begin(), candidates.end(), [&](const Candidate& c) { return c.unit == unit.id; });
      apart = offered != candidates.end() && is_apart(*offered);
      candidates.erase(std::remove_if(candidates.begin(), candidates.end(),
                                      [&](const Candidate& c) { return apart ? c.unit != unit.id : is_apart(c); }),
                       candidates.end());
    }
    Match m;
    UpdateNodes nodes;
    nodes.apart = apart;
    for (const Candidate& c : candidates) {
      m.units.push_back(c.unit);
      for (NodeId taken : {c.cast, c.permute, c.copy})
        if (taken >= 0) m.units.push_back(cover.unit_of(taken).id);
      if (c.copy >= 0) m.carries.push_back(g.node(c.copy).outputs[0]);
      nodes.updates.push_back(c.update);
      nodes.casts.push_back(c.cast);
      nodes.permutes.push_back(c.permute);
      nodes.copies.push_back(c.copy);
    }
    m.detail = nodes;
    m.runs_at_last_unit = true;  // the updates' place, after every gradient, not the first cast's
    return m;
  }

  bool runs_beside_chain_end(const Launch& l) const override { return detail_of<UpdateNodes>(l).apart; }

  // The step advance (the scheduler seats it on the last update launch: launches apart come first, each
  // at its update, and their updates follow the order of their gradients).
  bool takes_rider(const sg::Graph& g, const Launch&, const Launch& rider) const override {
    return rider.nodes.size() == 1 && g.node(rider.nodes[0]).op == OpKind::advance_step;
  }

  std::string describe(const sg::Graph&, const Launch& l) const override {
    const auto& nodes = detail_of<UpdateNodes>(l);
    const auto casts = std::count_if(nodes.casts.begin(), nodes.casts.end(), [](NodeId c) { return c >= 0; });
    const auto permutes =
        std::count_if(nodes.permutes.begin(), nodes.permutes.end(), [](NodeId p) { return p >= 0; });
    const auto copies = std::count_if(nodes.copies.begin(), nodes.copies.end(), [](NodeId c) { return c >= 0; });
    return fmt::format("{} tensors,one pass each{}{}{}{}", nodes.updates.size(), nodes.apart ? ",apart" : "",
                       casts > 0 ? fmt::format(",{} gradient casts", casts) : "",
                       permutes > 0 ? fmt::format(",{} gradients read [O,KH,KW,C]", permutes) : "",
                       copies > 0 ? fmt::format(",{} compute copies for the next step", copies) : "");
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto& detail = detail_of<UpdateNodes>(l);
    const auto& nodes = detail.updates;
    const Node& first = g.node(nodes.front());
    const DType grad_type = g.value(read_gradient(g, first, detail.casts.front())).dtype;
    const UpdateInputs in = *update_inputs(first);
    const UpdateScalars* scalars = c.update_scalars(first.id);  // every update's lr is the same run state
    const auto* step = in.step >= 0 ? static_cast<const std::int32_t*>(c.ptr(in.step)) : nullptr;
    const auto* scale = in.clip_scale >= 0 ? static_cast<const float*>(c.ptr(in.clip_scale)) : nullptr;
    std::int32_t* advance = nullptr;
    for (NodeId r : l.riders) advance = static_cast<std::int32_t*>(c.ptr(g.node(r).inputs[0]));
    const bool dependent = c.options().dependent_launch;
    const auto ptr = [&](ValueId v) { return c.ptr(v); };
    std::function<void(cudaStream_t)> run;
    with_update_rule(first, [&](auto rule, auto hyper) {
      using Rule = typename decltype(rule)::type;
      with_update_types(g.value(in.param).dtype, grad_type, [&](auto wt, auto gt) {
        using W = decltype(wt);
        using G = decltype(gt);
        std::vector<UpdateTensor<W, G>> tensors;
        for (std::size_t i = 0; i < nodes.size(); ++i) {
          const Node& n = g.node(nodes[i]);
          const UpdateInputs u = *update_inputs(n);
          const ValueId grad = gradient_read(g, u.grad, detail.casts[i], detail.permutes[i]);
          const std::int64_t elements = element_count(g.value(u.param).shape);
          const ElementRange r = update_range(c, grad, elements);
          const GradientOrder order =
              gradient_order(g, detail.permutes[i], r.count, elements, "update_multi_tensor", n.id);
          const auto state = [&](ValueId v) { return advanced<void>(ptr(v), g.value(v).dtype, r); };
          tensors.push_back({advanced<W>(c.ptr(u.param), g.value(u.param).dtype, r),
                             advanced<const G>(c.ptr(grad), g.value(grad).dtype, r), state_slots(u, state), r.count,
                             order, compute_copy(c, detail.copies[i])});
        }
        auto kernel = std::make_shared<MultiTensorUpdate<Rule, W, G>>(tensors, hyper);
        run = [=](cudaStream_t s) { kernel->launch(scalars, step, scale, advance, s, dependent); };
      });
    });
    return std::make_unique<BoundLaunch>(std::move(run), "multi-tensor", fill_compute_copies(c, detail.copies));
  }

 private:
  bool per_bucket_, large_apart_;
};

}  // namespace

// (The factory keeps its issue-21 name: runtime/cuda/lowerings/registry.cpp calls it.)
std::unique_ptr<CudaLowering> make_update_multi_tensor_lowering(bool per_bucket, bool large_apart) {
  return std::make_unique<UpdateMultiTensorLowering>(per_bucket, large_apart);
}

}  // namespace sg::cuda
