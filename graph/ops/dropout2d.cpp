// dropout2d: (X [N,C,H,W], step i32[1]) -> Y, PyTorch's Dropout2d in
// training mode: channel (n, c) is zeroed whole with probability p, the kept
// ones are scaled by 1 / (1 - p). dropout2d_backward: (dY, step) -> dY times
// the same mask. The keep bit of channel (n, c) is dropout's Philox bit
// (ops/philox.hpp) of element n * C + c, keyed on (seed, stream, step): a
// pure function, so the backward recomputes the forward's mask (no mask
// buffer), and the GPU, graph replays and resumed runs draw the same bits
// (see dropout.cpp). Attributes are DropoutAttrs; with channels_last both
// take and give [N,H,W,C] values and drop the same channels.
#include <fmt/format.h>

#include "graph/ops/op_common.hpp"
#include "ops/cpu/conv_reference.hpp"

namespace sg::ops {
namespace {

std::vector<OutputSpec> infer_dropout2d(OpKind op, const Inputs& in, const OpAttrs& attrs) {
  expect_arity(op, in, 2, 2);
  expect_rank(op, *in[0], 4);
  expect_floating(op, *in[0]);
  if (in[1]->dtype != DType::i32 || in[1]->shape != Shape{1})
    fail(op, "step " + describe(*in[1]) + " must be i32 [1]");
  const double p = std::get<DropoutAttrs>(attrs).p;
  if (!(p >= 0.0 && p < 1.0)) fail(op, fmt::format("dropout probability p = {} must be in [0, 1)", p));
  return {{in[0]->shape, in[0]->dtype}};
}

std::vector<OutputSpec> infer_forward(const Inputs& in, const OpAttrs& attrs) {
  return infer_dropout2d(OpKind::dropout2d, in, attrs);
}
std::vector<OutputSpec> infer_backward(const Inputs& in, const OpAttrs& attrs) {
  return infer_dropout2d(OpKind::dropout2d_backward, in, attrs);
}

void gradient(const GradientContext& c) {
  if (!c.needs_grad(0)) return;
  c.contribute(0, c.emit(OpKind::dropout2d_backward, {*c.output_grad(0), c.input(1)}, c.node().attrs, c.input(0))
                      .front());
}

// The forward and the backward are the same map (x or dy times the mask).
template <typename T>
void dropout2d_cpu(const CpuCall<T>& c) {
  const auto& a = c.node.template attr<DropoutAttrs>();
  const auto& s = c.in[0].shape;
  const std::int64_t channels = a.channels_last ? s[3] : s[1], plane = a.channels_last ? s[1] * s[2] : s[2] * s[3];
  ref::dropout2d(c.in[0].real, s[0], channels, plane, a.p, a.seed, a.stream, c.in[1].i32[0], c.out[0].real,
                 a.channels_last);
}

}  // namespace

const OpDef& dropout2d_def() {
  static const OpDef def = with_attrs<DropoutAttrs>({.kind = OpKind::dropout2d, .name = "dropout2d",
                                                     .infer = &infer_forward, .gradient = &gradient,
                                                     .cpu_f32 = &dropout2d_cpu<float>,
                                                     .cpu_f64 = &dropout2d_cpu<double>});
  return def;
}

const OpDef& dropout2d_backward_def() {
  static const OpDef def = with_attrs<DropoutAttrs>({.kind = OpKind::dropout2d_backward, .name = "dropout2d_backward",
                                                     .infer = &infer_backward, .cpu_f32 = &dropout2d_cpu<float>,
                                                     .cpu_f64 = &dropout2d_cpu<double>});
  return def;
}

}  // namespace sg::ops
