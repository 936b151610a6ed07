// Mean pooling (issue 37).
// avg_pool2d: X [N,C,H,W] -> [N,C,(H-k)/s+1,(W-k)/s+1], the mean of each
// k x k window (no padding, floor: PyTorch's AvgPool2d(k, s)). With
// channels_last both take and give [N,H,W,C] values (the channels-last pass
// keeps it inside a region); the CPU reference runs the NCHW one on the
// values in the other order.
// avg_pool2d_backward: dY -> dX [N,C,grad_h,grad_w], dY / k^2 spread over
// each window. Unlike max_pool2d_backward it needs no X (the mean's
// derivative does not depend on the values), so X need not live until the
// backward; its H x W rides in the attributes instead.
// global_avg_pool2d: X [N,C,H,W] -> [N,C,1,1], the mean of each plane
// (PyTorch's AdaptiveAvgPool2d(1); a flatten after it gives [N,C]).
// global_avg_pool2d_backward: dY [N,C,1,1] -> dX (ReshapeAttrs::shape), dY /
// (H W) in every element of the plane.
#include <fmt/format.h>

#include "graph/ops/op_common.hpp"
#include "graph/ops/pool_shape.hpp"
#include "ops/cpu/avg_pool_reference.hpp"
#include "ops/cpu/layout_reference.hpp"

namespace sg::ops {
namespace {

std::vector<OutputSpec> infer_avg_pool2d(const Inputs& in, const OpAttrs& attrs) {
  constexpr OpKind op = OpKind::avg_pool2d;
  expect_arity(op, in, 1, 1);
  expect_rank(op, *in[0], 4);
  expect_floating(op, *in[0]);
  return {{pooled_shape(op, in[0]->shape, describe(*in[0]), std::get<Pool2dAttrs>(attrs)), in[0]->dtype}};
}

std::vector<OutputSpec> infer_avg_pool2d_backward(const Inputs& in, const OpAttrs& attrs) {
  constexpr OpKind op = OpKind::avg_pool2d_backward;
  expect_arity(op, in, 1, 1);
  const Value& dy = *in[0];
  expect_rank(op, dy, 4);
  expect_floating(op, dy);
  const auto& a = std::get<Pool2dAttrs>(attrs);
  Shape dx = dy.shape;
  dx[pool_height_dim(a)] = a.grad_h;
  dx[pool_height_dim(a) + 1] = a.grad_w;
  if (a.grad_h < 1 || a.grad_w < 1)
    fail(op, fmt::format("grad_h {} and grad_w {} (the input's size) must be >= 1", a.grad_h, a.grad_w));
  if (dy.shape != pooled_shape(op, dx, shape_string(dx), a))
    fail(op, fmt::format("gradient {} is not the pooled shape of {}", describe(dy), shape_string(dx)));
  return {{dx, dy.dtype}};
}

void avg_pool2d_gradient(const GradientContext& c) {
  if (!c.needs_grad(0)) return;
  const Shape& x = c.graph().value(c.input(0)).shape;
  Pool2dAttrs back = c.node().attr<Pool2dAttrs>();
  back.grad_h = x[pool_height_dim(back)];
  back.grad_w = x[pool_height_dim(back) + 1];
  c.contribute(0, c.emit(OpKind::avg_pool2d_backward, {*c.output_grad(0)}, back, c.input(0)).front());
}

template <typename T>
void avg_pool2d_cpu(const CpuCall<T>& c) {
  const auto& a = c.node.template attr<Pool2dAttrs>();
  const PoolPlanes in = pool_planes(c.in[0].shape, a), out = pool_planes(c.out[0].shape, a);
  const ref::ChannelsFirstView<T> x(c.in[0].real, a.channels_last, in.n, in.c, in.h * in.w);
  ref::ChannelsFirstOutput<T> y(c.out[0].real, a.channels_last, out.n, out.c, out.h * out.w);
  ref::avg_pool2d(x.data(), in.n * in.c, in.h, in.w, a.kernel, a.stride, y.data());
  y.finish();
}

template <typename T>
void avg_pool2d_backward_cpu(const CpuCall<T>& c) {
  const auto& a = c.node.template attr<Pool2dAttrs>();
  const PoolPlanes in = pool_planes(c.in[0].shape, a), out = pool_planes(c.out[0].shape, a);
  const ref::ChannelsFirstView<T> dy(c.in[0].real, a.channels_last, in.n, in.c, in.h * in.w);
  ref::ChannelsFirstOutput<T> dx(c.out[0].real, a.channels_last, out.n, out.c, out.h * out.w);
  ref::avg_pool2d_backward(dy.data(), out.n * out.c, out.h, out.w, a.kernel, a.stride, dx.data());
  dx.finish();
}

std::vector<OutputSpec> infer_global(const Inputs& in, const OpAttrs&) {
  constexpr OpKind op = OpKind::global_avg_pool2d;
  expect_arity(op, in, 1, 1);
  expect_rank(op, *in[0], 4);
  expect_floating(op, *in[0]);
  const Shape& x = in[0]->shape;
  if (x[2] < 1 || x[3] < 1) fail(op, fmt::format("{} has an empty plane", describe(*in[0])));
  return {{{x[0], x[1], 1, 1}, in[0]->dtype}};
}

std::vector<OutputSpec> infer_global_backward(const Inputs& in, const OpAttrs& attrs) {
  constexpr OpKind op = OpKind::global_avg_pool2d_backward;
  expect_arity(op, in, 1, 1);
  const Value& dy = *in[0];
  expect_floating(op, dy);
  const Shape& dx = std::get<ReshapeAttrs>(attrs).shape;
  if (dx.size() != 4 || dx[2] < 1 || dx[3] < 1)
    fail(op, fmt::format("the input's shape {} must be [N,C,H,W] with H, W >= 1", shape_string(dx)));
  if (dy.shape != Shape{dx[0], dx[1], 1, 1})
    fail(op, fmt::format("gradient {} is not the pooled shape of {}", describe(dy), shape_string(dx)));
  return {{dx, dy.dtype}};
}

void global_gradient(const GradientContext& c) {
  if (!c.needs_grad(0)) return;
  const ReshapeAttrs back{c.graph().value(c.input(0)).shape};
  c.contribute(0, c.emit(OpKind::global_avg_pool2d_backward, {*c.output_grad(0)}, back, c.input(0)).front());
}

template <typename T>
void global_cpu(const CpuCall<T>& c) {
  const auto& s = c.in[0].shape;
  ref::global_avg_pool2d(c.in[0].real, s[0] * s[1], s[2] * s[3], c.out[0].real);
}

template <typename T>
void global_backward_cpu(const CpuCall<T>& c) {
  const auto& s = c.out[0].shape;
  ref::global_avg_pool2d_backward(c.in[0].real, s[0] * s[1], s[2] * s[3], c.out[0].real);
}

}  // namespace

const OpDef& avg_pool2d_def() {
  static const OpDef def = with_attrs<Pool2dAttrs>({.kind = OpKind::avg_pool2d, .name = "avg_pool2d",
                                                    .infer = &infer_avg_pool2d, .gradient = &avg_pool2d_gradient,
                                                    .cpu_f32 = &avg_pool2d_cpu<float>,
                                                    .cpu_f64 = &avg_pool2d_cpu<double>});
  return def;
}

const OpDef& avg_pool2d_backward_def() {
  static const OpDef def = with_attrs<Pool2dAttrs>(
      {.kind = OpKind::avg_pool2d_backward, .name = "avg_pool2d_backward", .infer = &infer_avg_pool2d_backward,
       .cpu_f32 = &avg_pool2d_backward_cpu<float>, .cpu_f64 = &avg_pool2d_backward_cpu<double>});
  return def;
}

const OpDef& global_avg_pool2d_def() {
  static const OpDef def = with_attrs<NoAttrs>({.kind = OpKind::global_avg_pool2d, .name = "global_avg_pool2d",
                                                .infer = &infer_global, .gradient = &global_gradient,
                                                .cpu_f32 = &global_cpu<float>, .cpu_f64 = &global_cpu<double>});
  return def;
}

const OpDef& global_avg_pool2d_backward_def() {
  static const OpDef def = with_attrs<ReshapeAttrs>(
      {.kind = OpKind::global_avg_pool2d_backward, .name = "global_avg_pool2d_backward",
       .infer = &infer_global_backward, .cpu_f32 = &global_backward_cpu<float>,
       .cpu_f64 = &global_backward_cpu<double>});
  return def;
}

}  // namespace sg::ops
