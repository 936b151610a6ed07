// Gradient clipping by the global L2 norm (torch.nn.utils.clip_grad_norm_):
// grad_clip_scale: (grad, grad, ...) -> f32[1] min(1, max_norm / (norm + 1e-6))
//   over every element of every input; the optimizer updates read it.
// scale_grad: (grad, scale f32[1]) -> grad * scale (for updates that take no
//   scale themselves: SGD).
// Neither is differentiated: they sit between autodiff and the updates.
#include <fmt/format.h>

#include "graph/ops/op_common.hpp"

namespace sg::ops {
namespace {

std::vector<OutputSpec> infer_clip_scale(const Inputs& in, const OpAttrs& attrs) {
  const auto& a = std::get<ClipGradAttrs>(attrs);
  if (in.empty()) fail(OpKind::grad_clip_scale, "expects at least one gradient");
  for (const Value* v : in) expect_floating(OpKind::grad_clip_scale, *v);
  if (!(a.max_norm > 0.0)) fail(OpKind::grad_clip_scale, fmt::format("max_norm {} must be > 0", a.max_norm));
  return {{Shape{1}, DType::f32}};
}

template <typename T>
void clip_scale_cpu(const CpuCall<T>& c) {
  T sum = T(0);
  for (const auto& g : c.in) sum += ref::sum_of_squares(g.real, g.size);
  c.out[0].real[0] = ref::clip_scale_from_sum_of_squares(sum, T(c.node.template attr<ClipGradAttrs>().max_norm));
}

std::vector<OutputSpec> infer_scale_grad(const Inputs& in, const OpAttrs&) {
  expect_arity(OpKind::scale_grad, in, 2, 2);
  expect_floating(OpKind::scale_grad, *in[0]);
  if (in[1]->dtype != DType::f32 || in[1]->shape != Shape{1})
    fail(OpKind::scale_grad, fmt::format("scale {} must be f32 [1]", describe(*in[1])));
  return {{in[0]->shape, in[0]->dtype}};
}

template <typename T>
void scale_grad_cpu(const CpuCall<T>& c) {
  ref::scale_grad(c.in[0].real, c.in[0].size, c.in[1].real[0], c.out[0].real);
}

}  // namespace

const OpDef& grad_clip_scale_def() {
  static const OpDef def = with_attrs<ClipGradAttrs>({.kind = OpKind::grad_clip_scale, .name = "grad_clip_scale",
                                                      .infer = &infer_clip_scale, .cpu_f32 = &clip_scale_cpu<float>,
                                                      .cpu_f64 = &clip_scale_cpu<double>});
  return def;
}

const OpDef& scale_grad_def() {
  static const OpDef def = with_attrs<NoAttrs>({.kind = OpKind::scale_grad, .name = "scale_grad",
                                                .infer = &infer_scale_grad, .cpu_f32 = &scale_grad_cpu<float>,
                                                .cpu_f64 = &scale_grad_cpu<double>});
  return def;
}

}  // namespace sg::ops
