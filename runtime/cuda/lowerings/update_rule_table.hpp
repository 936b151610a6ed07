#pragma once
// The update lowerings' one table of update-rule ops (issue 35): graph op
// kind -> its kernel rule (ops/cuda/update_rules/), its hyper-parameters and
// where its inputs sit. update_multi_tensor, bias_grad_update and
// wgrad_update match "any update-rule op" through it, so a new optimizer adds
// a row here and its rule, and no lowering changes.
#include <array>
#include <optional>
#include <string>
#include <type_traits>

#include "graph/graph.hpp"
#include "graph/op.hpp"
#include "ops/cuda/update_rules/update_rule.hpp"
#include "runtime/cuda/lowerings/lone_units.hpp"

namespace sg::cuda {

// Where an update-rule node's inputs sit.
struct UpdateInputs {
  ValueId param = -1, grad = -1;
  std::array<ValueId, kMaxUpdateStates> state{-1, -1, -1};  // the rule's slots; -1: unused
  ValueId step = -1;        // the step counter, for rules with bias correction (Adam)
  ValueId clip_scale = -1;  // f32 [1] with clipping
};

// The rows: nullopt for an op that is no update rule.
inline std::optional<UpdateInputs> update_inputs(const Node& n) {
  const auto in = [&](std::size_t i) { return i < n.inputs.size() ? n.inputs[i] : ValueId(-1); };
  switch (n.op) {
    case OpKind::adam_update:  // (param, grad, m, v, step[, clip scale])
      return UpdateInputs{in(0), in(1), {in(2), in(3), -1}, in(4), in(5)};
    case OpKind::rmsprop_update: {  // (param, grad, square_avg[, momentum_buf][, grad_avg][, clip scale])
      const auto& a = n.attr<RmspropUpdateAttrs>();
      UpdateInputs u{in(0), in(1), {in(2), -1, -1}, -1, -1};
      std::size_t next = 3;
      if (a.momentum > 0.0) u.state[1] = in(next++);
      if (a.centered) u.state[2] = in(next++);
      u.clip_scale = in(next);
      return u;
    }
    default: return std::nullopt;
  }
}

// The update a bias's column sums feed, where a launch may take the chain:
// the sums (`sums`, a reduce_rows) -> [their free lone cast, when it alone
// reads them] -> a free lone update-rule node without a clip scale that alone
// reads the chain's end. The callers check the dtypes.
struct SumsUpdate {
  const CoverUnit* cast_unit = nullptr;  // null: the update reads the sums
  const CoverUnit* update_unit = nullptr;
  ValueId grad = -1;  // what the update reads: the sums or the cast's output
};
inline std::optional<SumsUpdate> sums_update(const Cover& cover, const Node& sums) {
  const sg::Graph& g = cover.graph();
  SumsUpdate chain;
  chain.grad = sums.outputs[0];
  NodeId reader = sole_reader(g, chain.grad);
  if (reader >= 0 && g.node(reader).op == OpKind::cast) {
    chain.cast_unit = free_lone_unit(cover, reader);
    if (!chain.cast_unit) return std::nullopt;
    chain.grad = g.node(reader).outputs[0];
    reader = sole_reader(g, chain.grad);
  }
  if (reader < 0) return std::nullopt;
  const auto inputs = update_inputs(g.node(reader));
  chain.update_unit = free_lone_unit(cover, reader);
  if (!inputs || inputs->clip_scale >= 0 || inputs->grad != chain.grad || !chain.update_unit) return std::nullopt;
  return chain;
}

inline bool is_update_rule_op(OpKind op) { return op == OpKind::adam_update || op == OpKind::rmsprop_update; }

// Whether `v`'s one reader is an update rule's node. A bias gradient's
// widening cast that it reads is left to the update launch
// (update_multi_tensor takes it with the weights' casts: one launch reads
// every gradient in f16/bf16) rather than folded into the sums.
inline bool read_by_update_rule(const sg::Graph& g, ValueId v) {
  const auto readers = g.consumers(v);
  return readers.size() == 1 && is_update_rule_op(g.node(readers[0]).op);
}

// The free lone cast that alone reads `sum` (no graph output), widening its
// f16/bf16 to f32 for an fp32 master, where no update rule reads the widened
// value: the cast a sum's kernel (channel_sum, column_sum, conv_wgrad_bias)
// folds in by writing the rounded sum as f32. Else null.
inline const CoverUnit* free_widening_cast(const Cover& cover, ValueId sum) {
  const sg::Graph& g = cover.graph();
  const CoverUnit* cast = free_sole_reader(cover, sum, OpKind::cast);
  if (!cast || !is_half_width_float(g.value(sum).dtype)) return nullptr;
  const ValueId wide = g.node(cast->nodes.front()).outputs[0];
  return g.value(wide).dtype == DType::f32 && !read_by_update_rule(g, wide) ? cast : nullptr;
}

inline AdamHyper hyper_of(const AdamUpdateAttrs& a) {
  return {float(a.beta1), float(a.beta2), float(a.eps), float(a.weight_decay), a.decoupled};
}
inline RmspropHyper hyper_of(const RmspropUpdateAttrs& a) {
  return {float(a.alpha), float(a.eps), float(a.weight_decay), float(a.momentum), a.centered};
}

// Calls f(std::type_identity<Rule>{}, hyper) for an update-rule node; false for any other node.
template <typename F>
bool with_update_rule(const Node& n, F&& f) {
  switch (n.op) {
    case OpKind::adam_update: f(std::type_identity<AdamRule>{}, hyper_of(n.attr<AdamUpdateAttrs>())); return true;
    case OpKind::rmsprop_update: f(std::type_identity<RmspropRule>{}, hyper_of(n.attr<RmspropUpdateAttrs>())); return true;
    default: return false;
  }
}

// The rule's name in dump lines: "adam", "adamw", "rmsprop".
inline std::string update_rule_name(const Node& n) {
  if (n.op == OpKind::adam_update) return n.attr<AdamUpdateAttrs>().decoupled ? "adamw" : "adam";
  if (n.op == OpKind::rmsprop_update) return "rmsprop";
  return std::string(op_name(n.op));
}

// The device pointers of a node's state slots (null where unused).
template <typename Ptr>
StateSlots state_slots(const UpdateInputs& u, Ptr&& ptr) {
  StateSlots s{};
  for (int i = 0; i < kMaxUpdateStates; ++i)
    s.slot[i] = u.state[std::size_t(i)] >= 0 ? static_cast<float*>(ptr(u.state[std::size_t(i)])) : nullptr;
  return s;
}

}  // namespace sg::cuda
