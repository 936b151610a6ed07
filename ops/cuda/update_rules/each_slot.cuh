#pragma once
// Visiting a rule's used state slots in the update kernels, as fold
// expressions, not loops: `#pragma unroll` loops over the slots changed how
// the compiler unrolled the multi-tensor update's element loop and split its
// 16-byte state stores into four (Adam's PTX then differed from issue 21's
// kernel; with the folds it is instruction for instruction the same).
#include <type_traits>
#include <utility>

#include "ops/cuda/update_rules/update_rule.hpp"

namespace sg::cuda {

// Calls f(std::integral_constant<int, J>{}) for each slot J the rule uses.
template <class Rule, class F, int... J>
__device__ __forceinline__ void each_slot(const HyperOf<Rule>& hyper, F&& f, std::integer_sequence<int, J...>) {
  (..., (Rule::has_state(hyper, J) ? f(std::integral_constant<int, J>{}) : void()));
}
template <class Rule, class F>
__device__ __forceinline__ void each_slot(const HyperOf<Rule>& hyper, F&& f) {
  each_slot<Rule>(hyper, f, std::make_integer_sequence<int, Rule::kStates>{});
}

// Whether every used slot's pointer is 16-byte aligned (one && chain).
template <class Rule, int... J>
__device__ __forceinline__ bool slots_aligned16(const StateSlots& state, const HyperOf<Rule>& hyper,
                                                std::integer_sequence<int, J...>) {
  return (... && (!Rule::has_state(hyper, J) || reinterpret_cast<std::uintptr_t>(state.slot[J]) % 16 == 0));
}
template <class Rule>
__device__ __forceinline__ bool slots_aligned16(const StateSlots& state, const HyperOf<Rule>& hyper) {
  return slots_aligned16<Rule>(state, hyper, std::make_integer_sequence<int, Rule::kStates>{});
}

}  // namespace sg::cuda
