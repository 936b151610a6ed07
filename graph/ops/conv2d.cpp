// conv2d: (X [N,C,H,W], W [O,C,KH,KW][, b [O]]) -> Y [N,O,H',W'] with
// H' = (H + 2p - KH) / s + 1 (floor), zero padding; and its two backward ops,
// conv2d_backward_data (dY, W) -> dX and conv2d_backward_filter (dY, X) -> dW.
// The bias gradient is channel_sum(dY) (channel_sum.cpp). Layout NCHW:
// cuDNN's default and PyTorch's (see Conv2dAttrs in graph/op.hpp); with
// channels_last the activations are [N,H,W,C], the bias gradient is the
// column sums (reduce_rows) of dY seen as [N*H*W, C], and the CPU reference
// is the NCHW one on the values reordered (ops/cpu/layout_reference.hpp).
// With filter_channels_last W and dW are [O,KH,KW,C]: the same reordering,
// a filter's O, C, KH, KW standing where an activation's N, C, H, W do.
#include <fmt/format.h>

#include "graph/ops/op_common.hpp"
#include "ops/cpu/conv_reference.hpp"
#include "ops/cpu/layout_reference.hpp"

namespace sg::ops {
namespace {

// An activation's sizes in NCHW terms, whatever its layout (and a filter's
// O, C, KH, KW as N, C, H, W).
struct Nchw {
  std::int64_t n, c, h, w;
};
Nchw nchw(std::span<const std::int64_t> s, bool channels_last) {
  return channels_last ? Nchw{s[0], s[3], s[1], s[2]} : Nchw{s[0], s[1], s[2], s[3]};
}
Shape activation_shape(const Nchw& d, bool channels_last) {
  return channels_last ? Shape{d.n, d.h, d.w, d.c} : Shape{d.n, d.c, d.h, d.w};
}

void expect_geometry(OpKind op, const Conv2dAttrs& a) {
  if (a.stride < 1) fail(op, fmt::format("stride {} must be >= 1", a.stride));
  if (a.padding < 0) fail(op, fmt::format("padding {} must be >= 0", a.padding));
}

// The output extent along one axis, or a GraphError naming both values when
// the kernel does not fit the padded input.
std::int64_t output_extent(OpKind op, std::int64_t in, std::int64_t kernel, const Conv2dAttrs& a, const Value& x,
                           const Value& w, const Nchw& xd, const Nchw& wd) {
  if (in + 2 * a.padding < kernel)
    fail(op, fmt::format("kernel {}x{} of {} is larger than the padded input {}x{} (padding {}) of {}", wd.h, wd.w,
                         describe(w), xd.h + 2 * a.padding, xd.w + 2 * a.padding, a.padding, describe(x)));
  return (in + 2 * a.padding - kernel) / a.stride + 1;
}

std::vector<OutputSpec> infer_forward(const Inputs& in, const OpAttrs& attrs) {
  constexpr OpKind op = OpKind::conv2d;
  const auto& a = std::get<Conv2dAttrs>(attrs);
  expect_arity(op, in, 2, 3);
  const Value &x = *in[0], &w = *in[1];
  expect_rank(op, x, 4);
  expect_rank(op, w, 4);
  expect_floating(op, x);
  expect_same_dtype(op, x, w);
  expect_geometry(op, a);
  const Nchw xd = nchw(x.shape, a.channels_last), wd = nchw(w.shape, a.filter_channels_last);
  if (xd.c != wd.c)
    fail(op, fmt::format("channel mismatch: input {} has {} channels, weight {} expects {}", describe(x), xd.c,
                         describe(w), wd.c));
  if (in.size() == 3) {
    const Value& b = *in[2];
    expect_same_dtype(op, x, b);
    if (b.shape != Shape{wd.n})
      fail(op, fmt::format("bias {} must be [{}], one per output channel of weight {}", describe(b), wd.n,
                           describe(w)));
  }
  const std::int64_t oh = output_extent(op, xd.h, wd.h, a, x, w, xd, wd);
  const std::int64_t ow = output_extent(op, xd.w, wd.w, a, x, w, xd, wd);
  return {{activation_shape({xd.n, wd.n, oh, ow}, a.channels_last), x.dtype}};
}

// dY must be the conv2d output of an input of grad_h x grad_w (backward
// data) or of a grad_h x grad_w kernel (backward filter) over `other`.
void expect_dy_matches(OpKind op, const Value& dy, std::int64_t h, std::int64_t w, std::int64_t kh, std::int64_t kw,
                       const Conv2dAttrs& a) {
  const Nchw d = nchw(dy.shape, a.channels_last);
  if (h + 2 * a.padding < kh || w + 2 * a.padding < kw || d.h != (h + 2 * a.padding - kh) / a.stride + 1 ||
      d.w != (w + 2 * a.padding - kw) / a.stride + 1)
    fail(op, fmt::format("gradient {} is not the output of a {}x{} input and a {}x{} kernel (stride {}, padding {})",
                         describe(dy), h, w, kh, kw, a.stride, a.padding));
}

std::vector<OutputSpec> infer_backward_data(const Inputs& in, const OpAttrs& attrs) {
  constexpr OpKind op = OpKind::conv2d_backward_data;
  const auto& a = std::get<Conv2dAttrs>(attrs);
  expect_arity(op, in, 2, 2);
  const Value &dy = *in[0], &w = *in[1];
  expect_rank(op, dy, 4);
  expect_rank(op, w, 4);
  expect_floating(op, dy);
  expect_same_dtype(op, dy, w);
  expect_geometry(op, a);
  const Nchw d = nchw(dy.shape, a.channels_last), wd = nchw(w.shape, a.filter_channels_last);
  if (d.c != wd.n)
    fail(op, fmt::format("channel mismatch: gradient {} vs weight {}", describe(dy), describe(w)));
  expect_dy_matches(op, dy, a.grad_h, a.grad_w, wd.h, wd.w, a);
  return {{activation_shape({d.n, wd.c, a.grad_h, a.grad_w}, a.channels_last), dy.dtype}};
}

std::vector<OutputSpec> infer_backward_filter(const Inputs& in, const OpAttrs& attrs) {
  constexpr OpKind op = OpKind::conv2d_backward_filter;
  const auto& a = std::get<Conv2dAttrs>(attrs);
  expect_arity(op, in, 2, 2);
  const Value &dy = *in[0], &x = *in[1];
  expect_rank(op, dy, 4);
  expect_rank(op, x, 4);
  expect_floating(op, dy);
  expect_same_dtype(op, dy, x);
  expect_geometry(op, a);
  if (dy.shape[0] != x.shape[0])
    fail(op, fmt::format("batch mismatch: gradient {} vs input {}", describe(dy), describe(x)));
  if (a.grad_h < 1 || a.grad_w < 1) fail(op, fmt::format("kernel size {}x{} must be positive", a.grad_h, a.grad_w));
  const Nchw xd = nchw(x.shape, a.channels_last);
  expect_dy_matches(op, dy, xd.h, xd.w, a.grad_h, a.grad_w, a);
  return {{activation_shape({nchw(dy.shape, a.channels_last).c, xd.c, a.grad_h, a.grad_w}, a.filter_channels_last),
           dy.dtype}};
}

void gradient(const GradientContext& c) {
  const auto& a = c.node().attr<Conv2dAttrs>();
  const ValueId dy = *c.output_grad(0);
  const Value& x = c.graph().value(c.input(0));
  const Value& w = c.graph().value(c.input(1));
  const Nchw xd = nchw(x.shape, a.channels_last), wd = nchw(w.shape, a.filter_channels_last);
  if (c.needs_grad(0)) {
    const Conv2dAttrs data{a.stride, a.padding, xd.h, xd.w, a.channels_last, a.filter_channels_last};
    c.contribute(0, c.emit(OpKind::conv2d_backward_data, {dy, c.input(1)}, data, c.input(0)).front());
  }
  if (c.needs_grad(1)) {
    const Conv2dAttrs filter{a.stride, a.padding, wd.h, wd.w, a.channels_last, a.filter_channels_last};
    c.contribute(1, c.emit(OpKind::conv2d_backward_filter, {dy, c.input(0)}, filter, c.input(1)).front());
  }
  if (c.node().inputs.size() != 3 || !c.needs_grad(2)) return;
  if (!a.channels_last) {
    c.contribute(2, c.emit(OpKind::channel_sum, {dy}, NoAttrs{}, c.input(2)).front());
    return;
  }
  // [N,H,W,C]: a channel's values are a column of the [N*H*W, C] matrix.
  const Shape& ys = c.graph().value(dy).shape;
  const ValueId rows = c.emit(OpKind::reshape, {dy}, ReshapeAttrs{{ys[0] * ys[1] * ys[2], ys[3]}}, dy).front();
  c.contribute(2, c.emit(OpKind::reduce_rows, {rows}, NoAttrs{}, c.input(2)).front());
}

// The NCHW geometry of an activation `x` and weights `w` (each in its layout).
ref::Conv2dGeometry geometry_of(std::span<const std::int64_t> x, std::span<const std::int64_t> w,
                                const Conv2dAttrs& a) {
  const Nchw d = nchw(x, a.channels_last), f = nchw(w, a.filter_channels_last);
  return {.n = d.n, .c = d.c, .h = d.h, .w = d.w, .o = f.n, .kh = f.h, .kw = f.w, .stride = a.stride,
          .padding = a.padding};
}

template <typename T>
void forward_cpu(const CpuCall<T>& c) {
  const auto& a = c.node.template attr<Conv2dAttrs>();
  const auto g = geometry_of(c.in[0].shape, c.in[1].shape, a);
  const ref::ChannelsFirstView<T> x(c.in[0].real, a.channels_last, g.n, g.c, g.h * g.w);
  const ref::ChannelsFirstView<T> w(c.in[1].real, a.filter_channels_last, g.o, g.c, g.kh * g.kw);
  ref::ChannelsFirstOutput<T> y(c.out[0].real, a.channels_last, g.n, g.o, g.oh() * g.ow());
  ref::conv2d(x.data(), w.data(), c.in.size() == 3 ? c.in[2].real : nullptr, g, y.data());
  y.finish();
}

// The geometry is the forward's: X is the output dX [N,C,H,W].
template <typename T>
void backward_data_cpu(const CpuCall<T>& c) {
  const auto& a = c.node.template attr<Conv2dAttrs>();
  const auto g = geometry_of(c.out[0].shape, c.in[1].shape, a);
  const ref::ChannelsFirstView<T> dy(c.in[0].real, a.channels_last, g.n, g.o, g.oh() * g.ow());
  const ref::ChannelsFirstView<T> w(c.in[1].real, a.filter_channels_last, g.o, g.c, g.kh * g.kw);
  ref::ChannelsFirstOutput<T> dx(c.out[0].real, a.channels_last, g.n, g.c, g.h * g.w);
  ref::conv2d_backward_data(dy.data(), w.data(), g, dx.data());
  dx.finish();
}

// The geometry is the forward's: W is the output dW.
template <typename T>
void backward_filter_cpu(const CpuCall<T>& c) {
  const auto& a = c.node.template attr<Conv2dAttrs>();
  const auto g = geometry_of(c.in[1].shape, c.out[0].shape, a);
  const ref::ChannelsFirstView<T> dy(c.in[0].real, a.channels_last, g.n, g.o, g.oh() * g.ow());
  const ref::ChannelsFirstView<T> x(c.in[1].real, a.channels_last, g.n, g.c, g.h * g.w);
  ref::ChannelsFirstOutput<T> dw(c.out[0].real, a.filter_channels_last, g.o, g.c, g.kh * g.kw);
  ref::conv2d_backward_filter(dy.data(), x.data(), g, dw.data());
  dw.finish();
}

}  // namespace

const OpDef& conv2d_def() {
  static const OpDef def = with_attrs<Conv2dAttrs>({.kind = OpKind::conv2d, .name = "conv2d", .infer = &infer_forward,
                                                    .gradient = &gradient, .cpu_f32 = &forward_cpu<float>,
                                                    .cpu_f64 = &forward_cpu<double>});
  return def;
}

const OpDef& conv2d_backward_data_def() {
  static const OpDef def = with_attrs<Conv2dAttrs>(
      {.kind = OpKind::conv2d_backward_data, .name = "conv2d_backward_data", .infer = &infer_backward_data,
       .cpu_f32 = &backward_data_cpu<float>, .cpu_f64 = &backward_data_cpu<double>});
  return def;
}

const OpDef& conv2d_backward_filter_def() {
  static const OpDef def = with_attrs<Conv2dAttrs>(
      {.kind = OpKind::conv2d_backward_filter, .name = "conv2d_backward_filter", .infer = &infer_backward_filter,
       .cpu_f32 = &backward_filter_cpu<float>, .cpu_f64 = &backward_filter_cpu<double>});
  return def;
}

}  // namespace sg::ops
