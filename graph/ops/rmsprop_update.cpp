// rmsprop_update: (param, grad, square_avg[, momentum_buf][, grad_avg][, clip
// scale f32[1]]) -> nothing; PyTorch's RMSprop step in place on param and its
// state (torch.optim.RMSprop: weight decay added to the gradient). Alpha, eps,
// weight decay, momentum and centering are attributes, and say which state
// inputs there are: momentum_buf when momentum > 0, grad_avg when centered
// (all f32, the parameter's shape). The learning rate is the executor's
// optimizer scalar (run state). No step counter: RMSprop has no bias correction.
#include <fmt/format.h>

#include "graph/ops/op_common.hpp"

namespace sg::ops {
namespace {

constexpr OpKind kOp = OpKind::rmsprop_update;

// The state inputs the attributes call for (square_avg, then momentum_buf, then grad_avg).
std::size_t state_count(const RmspropUpdateAttrs& a) {
  return 1 + (a.momentum > 0.0 ? 1 : 0) + (a.centered ? 1 : 0);
}

std::vector<OutputSpec> infer(const Inputs& in, const OpAttrs& attrs) {
  const auto& a = std::get<RmspropUpdateAttrs>(attrs);
  const std::size_t states = state_count(a);
  expect_arity(kOp, in, 2 + states, 3 + states);
  expect_floating(kOp, *in[0]);
  expect_floating(kOp, *in[1]);
  expect_same_shape(kOp, *in[0], *in[1]);
  for (std::size_t s = 2; s < 2 + states; ++s) {
    expect_same_shape(kOp, *in[0], *in[s]);
    if (in[s]->dtype != DType::f32) fail(kOp, fmt::format("state {} must be f32", describe(*in[s])));
  }
  if (in.size() == 3 + states && (in.back()->dtype != DType::f32 || in.back()->shape != Shape{1}))
    fail(kOp, fmt::format("clip scale {} must be f32 [1]", describe(*in.back())));
  if (!(a.alpha >= 0.0 && a.alpha < 1.0)) fail(kOp, fmt::format("alpha {} must be in [0, 1)", a.alpha));
  if (!(a.eps > 0.0) || !(a.weight_decay >= 0.0) || !(a.momentum >= 0.0))
    fail(kOp, fmt::format("eps {} must be > 0, weight decay {} and momentum {} >= 0", a.eps, a.weight_decay,
                          a.momentum));
  return {};
}

// param and every state slot the attributes call for; never the clip scale
// after them (a grad value every update reads).
std::vector<int> in_place(const OpAttrs& attrs, int) {
  const auto states = static_cast<int>(state_count(std::get<RmspropUpdateAttrs>(attrs)));
  std::vector<int> slots{0};
  for (int s = 0; s < states; ++s) slots.push_back(2 + s);
  return slots;
}

template <typename T>
void cpu(const CpuCall<T>& c) {
  if (!c.learning_rate)
    throw GraphError(fmt::format("rmsprop_update (node {}): the executor has no learning rate (set_learning_rate)",
                                 c.node.id));
  const auto& a = c.node.template attr<RmspropUpdateAttrs>();
  const std::size_t states = state_count(a);
  std::size_t next = 3;
  T* momentum_buf = a.momentum > 0.0 ? c.in[next++].real : nullptr;
  T* grad_avg = a.centered ? c.in[next++].real : nullptr;
  const T scale = c.in.size() == 3 + states ? c.in.back().real[0] : T(1);
  ref::rmsprop_update(c.in[0].real, c.in[1].real, c.in[2].real, momentum_buf, grad_avg, c.in[0].size,
                      T(*c.learning_rate), T(a.alpha), T(a.eps), T(a.weight_decay), T(a.momentum), a.centered, scale);
}

}  // namespace

const OpDef& rmsprop_update_def() {
  static const OpDef def = with_attrs<RmspropUpdateAttrs>({.kind = kOp, .name = "rmsprop_update", .infer = &infer,
                                                           .in_place = &in_place, .cpu_f32 = &cpu<float>,
                                                           .cpu_f64 = &cpu<double>});
  return def;
}

}  // namespace sg::ops
