// max_pool2d: X [N,C,H,W] -> [N,C,(H-k)/s+1,(W-k)/s+1], the maximum of each
// k x k window (no padding, floor: PyTorch's MaxPool2d(k, s)).
// max_pool2d_backward: (dY, X) -> dX, each dY element routed to the FIRST
// maximum of its window in row-major order (PyTorch's tie rule).
// The backward takes X and recomputes the argmax rather than taking an index
// buffer from the forward (or Y): like dropout's recomputed mask, no extra
// [N,C,H',W'] index value lives from the forward to the backward, the forward
// stays a single output, and X alone decides ties (Y cannot say WHICH of
// equal elements was the maximum). X is alive anyway as the input of the
// layer, whose own gradient reads it.
#include <fmt/format.h>

#include "graph/ops/op_common.hpp"
#include "ops/cpu/conv_reference.hpp"

namespace sg::ops {
namespace {

Shape pooled_shape(OpKind op, const Value& x, const Pool2dAttrs& a) {
  expect_rank(op, x, 4);
  expect_floating(op, x);
  if (a.kernel < 1 || a.stride < 1)
    fail(op, fmt::format("kernel {} and stride {} must be >= 1", a.kernel, a.stride));
  if (x.shape[2] < a.kernel || x.shape[3] < a.kernel)
    fail(op, fmt::format("kernel {}x{} is larger than the input {}", a.kernel, a.kernel, describe(x)));
  return {x.shape[0], x.shape[1], (x.shape[2] - a.kernel) / a.stride + 1, (x.shape[3] - a.kernel) / a.stride + 1};
}

std::vector<OutputSpec> infer_forward(const Inputs& in, const OpAttrs& attrs) {
  expect_arity(OpKind::max_pool2d, in, 1, 1);
  return {{pooled_shape(OpKind::max_pool2d, *in[0], std::get<Pool2dAttrs>(attrs)), in[0]->dtype}};
}

std::vector<OutputSpec> infer_backward(const Inputs& in, const OpAttrs& attrs) {
  constexpr OpKind op = OpKind::max_pool2d_backward;
  expect_arity(op, in, 2, 2);
  const Value &dy = *in[0], &x = *in[1];
  expect_same_dtype(op, dy, x);
  if (dy.shape != pooled_shape(op, x, std::get<Pool2dAttrs>(attrs)))
    fail(op, fmt::format("gradient {} is not the pooled shape of input {}", describe(dy), describe(x)));
  return {{x.shape, x.dtype}};
}

void gradient(const GradientContext& c) {
  if (!c.needs_grad(0)) return;
  c.contribute(0, c.emit(OpKind::max_pool2d_backward, {*c.output_grad(0), c.input(0)}, c.node().attrs, c.input(0))
                      .front());
}

template <typename T>
void forward_cpu(const CpuCall<T>& c) {
  const auto& a = c.node.template attr<Pool2dAttrs>();
  const auto& s = c.in[0].shape;
  ref::max_pool2d(c.in[0].real, s[0] * s[1], s[2], s[3], a.kernel, a.stride, c.out[0].real);
}

template <typename T>
void backward_cpu(const CpuCall<T>& c) {
  const auto& a = c.node.template attr<Pool2dAttrs>();
  const auto& s = c.in[1].shape;
  ref::max_pool2d_backward(c.in[0].real, c.in[1].real, s[0] * s[1], s[2], s[3], a.kernel, a.stride, c.out[0].real);
}

}  // namespace

const OpDef& max_pool2d_def() {
  static const OpDef def = with_attrs<Pool2dAttrs>({.kind = OpKind::max_pool2d, .name = "max_pool2d",
                                                    .infer = &infer_forward, .gradient = &gradient,
                                                    .cpu_f32 = &forward_cpu<float>, .cpu_f64 = &forward_cpu<double>});
  return def;
}

const OpDef& max_pool2d_backward_def() {
  static const OpDef def = with_attrs<Pool2dAttrs>(
      {.kind = OpKind::max_pool2d_backward, .name = "max_pool2d_backward", .infer = &infer_backward,
       .cpu_f32 = &backward_cpu<float>, .cpu_f64 = &backward_cpu<double>});
  return def;
}

}  // namespace sg::ops
