// adam_update: (param, grad, m, v, step i32[1][, clip scale f32[1]]) ->
// nothing; PyTorch's Adam / AdamW step in place on param, m and v. Betas,
// eps, weight decay and decoupling are attributes; the learning rate is the
// executor's optimizer scalar (run state, changed by a schedule). Bias
// correction uses t = step + 1: the step counter is the graph's own, advanced
// after every update, so it lives on the device and resumes with the
// checkpoint's step.
#include <fmt/format.h>

#include "graph/ops/op_common.hpp"

namespace sg::ops {
namespace {

constexpr OpKind kOp = OpKind::adam_update;

std::vector<OutputSpec> infer(const Inputs& in, const OpAttrs& attrs) {
  const auto& a = std::get<AdamUpdateAttrs>(attrs);
  expect_arity(kOp, in, 5, 6);
  expect_floating(kOp, *in[0]);
  expect_floating(kOp, *in[1]);
  expect_same_shape(kOp, *in[0], *in[1]);
  for (int s : {2, 3}) {
    expect_same_shape(kOp, *in[0], *in[s]);
    if (in[s]->dtype != DType::f32) fail(kOp, fmt::format("moment {} must be f32", describe(*in[s])));
  }
  if (in[4]->dtype != DType::i32 || in[4]->shape != Shape{1})
    fail(kOp, fmt::format("step {} must be i32 [1]", describe(*in[4])));
  if (in.size() == 6 && (in[5]->dtype != DType::f32 || in[5]->shape != Shape{1}))
    fail(kOp, fmt::format("clip scale {} must be f32 [1]", describe(*in[5])));
  if (!(a.beta1 >= 0.0 && a.beta1 < 1.0) || !(a.beta2 >= 0.0 && a.beta2 < 1.0))
    fail(kOp, fmt::format("betas ({}, {}) must be in [0, 1)", a.beta1, a.beta2));
  if (!(a.eps > 0.0) || !(a.weight_decay >= 0.0))
    fail(kOp, fmt::format("eps {} must be > 0 and weight decay {} >= 0", a.eps, a.weight_decay));
  return {};
}

std::vector<int> in_place(const OpAttrs&, int) { return {0, 2, 3}; }

template <typename T>
void cpu(const CpuCall<T>& c) {
  if (!c.learning_rate)
    throw GraphError(fmt::format("adam_update (node {}): the executor has no learning rate (set_learning_rate)", c.node.id));
  const auto& a = c.node.template attr<AdamUpdateAttrs>();
  const std::int64_t t = std::int64_t(c.in[4].i32[0]) + 1;
  const T scale = c.in.size() == 6 ? c.in[5].real[0] : T(1);
  ref::adam_update(c.in[0].real, c.in[1].real, c.in[2].real, c.in[3].real, c.in[0].size, T(*c.learning_rate),
                   T(a.beta1), T(a.beta2), T(a.eps), T(a.weight_decay), a.decoupled, t, scale);
}

}  // namespace

const OpDef& adam_update_def() {
  static const OpDef def = with_attrs<AdamUpdateAttrs>({.kind = kOp, .name = "adam_update", .infer = &infer,
                                                        .in_place = &in_place, .cpu_f32 = &cpu<float>,
                                                        .cpu_f64 = &cpu<double>});
  return def;
}

}  // namespace sg::ops
