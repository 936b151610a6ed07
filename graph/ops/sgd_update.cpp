// sgd_update: (param, grad[, velocity]) -> nothing; PyTorch's SGD in place.
// momentum, weight decay and nesterov are attributes; the learning rate is the
// executor's optimizer scalar (run state, changed by a schedule).
#include <fmt/format.h>

#include "graph/ops/op_common.hpp"

namespace sg::ops {
namespace {

constexpr OpKind kOp = OpKind::sgd_update;

std::vector<OutputSpec> infer(const Inputs& in, const OpAttrs& attrs) {
  const auto& a = std::get<SgdUpdateAttrs>(attrs);
  expect_arity(kOp, in, 2, 3);
  expect_floating(kOp, *in[0]);
  expect_same_shape(kOp, *in[0], *in[1]);
  expect_same_dtype(kOp, *in[0], *in[1]);
  if (!(a.momentum >= 0.0) || !(a.weight_decay >= 0.0))
    fail(kOp, fmt::format("momentum {} and weight decay {} must be >= 0", a.momentum, a.weight_decay));
  if (in.size() == 3) {
    expect_same_shape(kOp, *in[0], *in[2]);
    if (a.momentum == 0.0) fail(kOp, "a velocity input needs momentum > 0");
  } else if (a.momentum != 0.0) {
    fail(kOp, "momentum > 0 needs a velocity input");
  }
  if (a.nesterov && a.momentum == 0.0) fail(kOp, "nesterov needs momentum > 0");
  return {};
}

std::vector<int> in_place(const OpAttrs&, int input_count) { return input_count == 3 ? std::vector<int>{0, 2} : std::vector<int>{0}; }

template <typename T>
void cpu(const CpuCall<T>& c) {
  if (!c.learning_rate)
    throw GraphError(fmt::format("sgd_update (node {}): the executor has no learning rate (set_learning_rate)", c.node.id));
  const auto& a = c.node.template attr<SgdUpdateAttrs>();
  T* velocity = c.in.size() == 3 ? c.in[2].real : nullptr;
  if (a.nesterov) {
    ref::sgd_nesterov_update(c.in[0].real, c.in[1].real, velocity, c.in[0].size, T(*c.learning_rate),
                             T(a.momentum), T(a.weight_decay));
    return;
  }
  ref::sgd_update(c.in[0].real, c.in[1].real, velocity, c.in[0].size, T(*c.learning_rate), T(a.momentum),
                  T(a.weight_decay));
}

}  // namespace

const OpDef& sgd_update_def() {
  static const OpDef def = with_attrs<SgdUpdateAttrs>({.kind = kOp, .name = "sgd_update", .infer = &infer,
                                                       .in_place = &in_place, .cpu_f32 = &cpu<float>,
                                                       .cpu_f64 = &cpu<double>});
  return def;
}

}  // namespace sg::ops
