#include "runtime/cuda/fast_paths/why_not_support.hpp"

#include <fmt/format.h>

#include "runtime/cuda/lowerings/update_rule_table.hpp"

namespace sg::cuda {
namespace {

// An optimizer's update: an in-place op on a parameter (not the step advance).
bool is_optimizer_update(const sg::Graph& g, const Node& n) {
  return op_updates_in_place(n.op) && !n.inputs.empty() && g.value(n.inputs[0]).role == Role::param;
}

}  // namespace

std::string not_sgd(const sg::Graph& g) {
  for (const Node& n : g.nodes()) {
    if (!is_optimizer_update(g, n) || n.op == OpKind::sgd_update) continue;
    return fmt::format("optimizer {}: the kernels apply SGD in-kernel", update_rule_name(n));
  }
  return {};
}

std::string not_plain_sgd(const sg::Graph& g) {
  if (std::string why = not_sgd(g); !why.empty()) return why;
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::sgd_update) continue;
    const auto& a = n.attr<SgdUpdateAttrs>();
    if (a.nesterov) return "optimizer SGD with Nesterov momentum: the kernels apply plain SGD";
    if (a.momentum != 0.0 || n.inputs.size() > 2) return "optimizer SGD with momentum: the kernels apply plain SGD";
  }
  return {};
}

std::string no_fp16_weights(const sg::Graph& g) {
  const Value* weight = nullptr;  // a matrix or filter parameter that is not fp16
  for (const Value& v : g.values()) {
    if (v.role != Role::param || v.shape.size() < 2) continue;
    if (v.dtype == DType::f16) return {};
    weight = &v;
  }
  if (!weight) return {};
  return fmt::format("weights are {} (precision.weights/compute): the kernels update fp16 weights only",
                     dtype_name(weight->dtype));
}

std::string accumulates_f16(const BackendOptions& o) {
  return o.accumulate_f16 ? "precision.accumulate: fp16 is cuBLASLt's compute type; our kernels accumulate in fp32" : "";
}

}  // namespace sg::cuda
