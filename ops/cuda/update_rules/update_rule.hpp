#pragma once
// The update stage's one concept (issue 35): an optimizer is an update RULE,
// and every update kernel (the multi-tensor update, the bias gradient's column
// sums into the update, the weight gradient's tile into the update) is a
// template over it, so a new optimizer adds its rule and touches no kernel.
// A rule (update_rules/<name>_rule.cuh, device code) is a struct made on the
// device from (hyper, lr, step, clip scale) once per launch, whose call
// operator updates one element: (w, g, state slots) -> new w, the slots
// written in place. This header is what host code sees of the rules: their
// names, hyper-parameters and state slots (f32, one per parameter element).
#include <cstdint>

namespace sg::cuda {

// Most state slots any rule has (RMSprop: square_avg, momentum_buf, grad_avg).
inline constexpr int kMaxUpdateStates = 3;

// Constant hyper-parameters of one Adam/AdamW update (graph attributes).
struct AdamHyper {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.f;
  bool decoupled = false;  // AdamW
};

// Constant hyper-parameters of one RMSprop update (PyTorch's torch.optim.RMSprop).
struct RmspropHyper {
  float alpha = 0.99f;
  float eps = 1e-8f;
  float weight_decay = 0.f;
  float momentum = 0.f;   // > 0: the momentum_buf slot is used
  bool centered = false;  // the grad_avg slot is used
};

// The rules (defined in adam_rule.cuh, rmsprop_rule.cuh).
struct AdamRule;     // slots: m, v
struct RmspropRule;  // slots: square_avg, momentum_buf (momentum > 0), grad_avg (centered)

template <class Rule>
struct RuleTraits;
template <>
struct RuleTraits<AdamRule> {
  using Hyper = AdamHyper;
  static constexpr int kStates = 2;
};
template <>
struct RuleTraits<RmspropRule> {
  using Hyper = RmspropHyper;
  static constexpr int kStates = 3;
};
template <class Rule>
using HyperOf = typename RuleTraits<Rule>::Hyper;

// A rule's state pointers, slot by slot (a slot the hyper-parameters leave
// unused is null). A plain array: kernels index it.
struct StateSlots {
  float* slot[kMaxUpdateStates] = {};
};

}  // namespace sg::cuda
