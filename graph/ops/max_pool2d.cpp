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
// With channels_last both take and give [N,H,W,C] values; the CPU reference
// is the NCHW one on the values reordered (ops/cpu/layout_reference.hpp).
#include <fmt/format.h>

#include "graph/ops/op_common.hpp"
#include "graph/ops/pool_shape.hpp"
#include "ops/cpu/conv_reference.hpp"
#include "ops/cpu/layout_reference.hpp"

namespace sg::ops {
namespace {

Shape checked_pooled_shape(OpKind op, const Value& x, const Pool2dAttrs& a) {
  expect_rank(op, x, 4);
  expect_floating(op, x);
  return pooled_shape(op, x.shape, describe(x), a);
}

std::vector<OutputSpec> infer_forward(const Inputs& in, const OpAttrs& attrs) {
  expect_arity(OpKind::max_pool2d, in, 1, 1);
  return {{checked_pooled_shape(OpKind::max_pool2d, *in[0], std::get<Pool2dAttrs>(attrs)), in[0]->dtype}};
}

std::vector<OutputSpec> infer_backward(const Inputs& in, const OpAttrs& attrs) {
  constexpr OpKind op = OpKind::max_pool2d_backward;
  expect_arity(op, in, 2, 2);
  const Value &dy = *in[0], &x = *in[1];
  expect_same_dtype(op, dy, x);
  if (dy.shape != checked_pooled_shape(op, x, std::get<Pool2dAttrs>(attrs)))
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
  const PoolPlanes p = pool_planes(c.in[0].shape, a);
  const ref::ChannelsFirstView<T> x(c.in[0].real, a.channels_last, p.n, p.c, p.h * p.w);
  ref::ChannelsFirstOutput<T> y(c.out[0].real, a.channels_last, p.n, p.c, p.oh(a) * p.ow(a));
  ref::max_pool2d(x.data(), p.n * p.c, p.h, p.w, a.kernel, a.stride, y.data());
  y.finish();
}

template <typename T>
void backward_cpu(const CpuCall<T>& c) {
  const auto& a = c.node.template attr<Pool2dAttrs>();
  const PoolPlanes p = pool_planes(c.in[1].shape, a);
  const ref::ChannelsFirstView<T> dy(c.in[0].real, a.channels_last, p.n, p.c, p.oh(a) * p.ow(a));
  const ref::ChannelsFirstView<T> x(c.in[1].real, a.channels_last, p.n, p.c, p.h * p.w);
  ref::ChannelsFirstOutput<T> dx(c.out[0].real, a.channels_last, p.n, p.c, p.h * p.w);
  ref::max_pool2d_backward(dy.data(), x.data(), p.n * p.c, p.h, p.w, a.kernel, a.stride, dx.data());
  dx.finish();
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
