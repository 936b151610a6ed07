// layer_norm (issue 37): PyTorch's LayerNorm(normalized_shape = X.shape[1:],
// eps) with its affine weight gamma and bias beta of that shape. The
// backward takes X and recomputes each example's mean and 1/std rather than
// taking them from the forward (as max_pool2d_backward recomputes its
// argmax): the forward stays one output, and the recomputation is one more
// read of a row the backward reads anyway.
// layer_norm_backward: (dY, X, gamma) -> (dX, dgamma, dbeta).
#include <fmt/format.h>

#include <span>

#include "graph/ops/op_common.hpp"
#include "ops/cpu/norm_reference.hpp"

namespace sg::ops {
namespace {

// X [N, ...] and gamma/beta of X's per-example shape; eps > 0.
void check_affine(OpKind op, const Value& x, const Value& gamma, const OpAttrs& attrs) {
  expect_floating(op, x);
  expect_floating(op, gamma);
  if (x.shape.size() < 2) fail(op, fmt::format("{} must have rank >= 2 ([N, ...])", describe(x)));
  const Shape example(x.shape.begin() + 1, x.shape.end());
  if (gamma.shape != example)
    fail(op, fmt::format("{} must have the per-example shape {} of {}", describe(gamma), shape_string(example),
                         describe(x)));
  if (!(std::get<LayerNormAttrs>(attrs).eps > 0.0))
    fail(op, fmt::format("eps {} must be > 0", std::get<LayerNormAttrs>(attrs).eps));
}

std::vector<OutputSpec> infer_forward(const Inputs& in, const OpAttrs& attrs) {
  constexpr OpKind op = OpKind::layer_norm;
  expect_arity(op, in, 3, 3);
  check_affine(op, *in[0], *in[1], attrs);
  expect_same_shape(op, *in[1], *in[2]);
  expect_same_dtype(op, *in[1], *in[2]);
  return {{in[0]->shape, in[0]->dtype}};
}

std::vector<OutputSpec> infer_backward(const Inputs& in, const OpAttrs& attrs) {
  constexpr OpKind op = OpKind::layer_norm_backward;
  expect_arity(op, in, 3, 3);
  const Value &dy = *in[0], &x = *in[1], &gamma = *in[2];
  check_affine(op, x, gamma, attrs);
  expect_same_shape(op, dy, x);
  expect_same_dtype(op, dy, x);
  return {{x.shape, x.dtype}, {gamma.shape, gamma.dtype}, {gamma.shape, gamma.dtype}};
}

void gradient(const GradientContext& c) { normalisation_gradient(c, OpKind::layer_norm_backward); }

// [N, ...] as N rows of the rest.
std::int64_t rows_of(std::span<const std::int64_t> s) { return s[0]; }
std::int64_t width_of(std::span<const std::int64_t> s) { return elements_from(s, 1); }

template <typename T>
void forward_cpu(const CpuCall<T>& c) {
  const auto& s = c.in[0].shape;
  ref::layer_norm(c.in[0].real, c.in[1].real, c.in[2].real, rows_of(s), width_of(s),
                  c.node.template attr<LayerNormAttrs>().eps, c.out[0].real);
}

template <typename T>
void backward_cpu(const CpuCall<T>& c) {
  const auto& s = c.in[1].shape;
  ref::layer_norm_backward(c.in[0].real, c.in[1].real, c.in[2].real, rows_of(s), width_of(s),
                           c.node.template attr<LayerNormAttrs>().eps, c.out[0].real, c.out[1].real, c.out[2].real);
}

}  // namespace

const OpDef& layer_norm_def() {
  static const OpDef def = with_attrs<LayerNormAttrs>({.kind = OpKind::layer_norm, .name = "layer_norm",
                                                       .infer = &infer_forward, .gradient = &gradient,
                                                       .cpu_f32 = &forward_cpu<float>, .cpu_f64 = &forward_cpu<double>});
  return def;
}

const OpDef& layer_norm_backward_def() {
  static const OpDef def = with_attrs<LayerNormAttrs>(
      {.kind = OpKind::layer_norm_backward, .name = "layer_norm_backward", .infer = &infer_backward,
       .cpu_f32 = &backward_cpu<float>, .cpu_f64 = &backward_cpu<double>});
  return def;
}

}  // namespace sg::ops
