// dropout: (X, step i32[1]) -> Y = X * keep / (1 - p), inverted dropout as
// PyTorch's nn.Dropout in training mode; dropout_backward: (dY, step) ->
// dY * keep / (1 - p). The keep bits are a pure function of (seed, stream,
// step, element) (ops/philox.hpp), so the backward recomputes the forward's
// mask instead of storing it: no mask buffer lives from the forward to the
// backward, and graph replay, stream launches, the CPU backend and a resumed
// run (the step counter is checkpointed) all draw the same bits. The step is
// the device-side step counter the batch fetch reads; the step advance runs
// after the backward, so both see the same value.
#include "graph/ops/op_common.hpp"

namespace sg::ops {
namespace {

std::vector<OutputSpec> infer_dropout(OpKind op, const Inputs& in, const OpAttrs& attrs) {
  expect_arity(op, in, 2, 2);
  expect_floating(op, *in[0]);
  if (in[1]->dtype != DType::i32 || in[1]->shape != Shape{1})
    fail(op, "step " + describe(*in[1]) + " must be i32 [1]");
  const double p = std::get<DropoutAttrs>(attrs).p;
  if (!(p >= 0.0 && p < 1.0)) fail(op, "dropout probability p must be in [0, 1)");
  return {{in[0]->shape, in[0]->dtype}};
}

std::vector<OutputSpec> infer_forward(const Inputs& in, const OpAttrs& attrs) {
  return infer_dropout(OpKind::dropout, in, attrs);
}
std::vector<OutputSpec> infer_backward(const Inputs& in, const OpAttrs& attrs) {
  return infer_dropout(OpKind::dropout_backward, in, attrs);
}

void gradient(const GradientContext& c) {
  if (!c.needs_grad(0)) return;
  c.contribute(0, c.emit(OpKind::dropout_backward, {*c.output_grad(0), c.input(1)}, c.node().attrs, c.input(0))
                      .front());
}

// The forward and the backward are the same map (x or dy times the mask).
template <typename T>
void dropout_cpu(const CpuCall<T>& c) {
  const auto& a = c.node.template attr<DropoutAttrs>();
  ref::dropout(c.in[0].real, c.in[0].size, a.p, a.seed, a.stream, c.in[1].i32[0], c.out[0].real);
}

}  // namespace

const OpDef& dropout_def() {
  static const OpDef def = with_attrs<DropoutAttrs>({.kind = OpKind::dropout, .name = "dropout",
                                                     .infer = &infer_forward, .gradient = &gradient,
                                                     .cpu_f32 = &dropout_cpu<float>, .cpu_f64 = &dropout_cpu<double>});
  return def;
}

const OpDef& dropout_backward_def() {
  static const OpDef def = with_attrs<DropoutAttrs>({.kind = OpKind::dropout_backward, .name = "dropout_backward",
                                                     .infer = &infer_backward, .cpu_f32 = &dropout_cpu<float>,
                                                     .cpu_f64 = &dropout_cpu<double>});
  return def;
}

}  // namespace sg::ops
