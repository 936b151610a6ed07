// matmul: (A, B) -> op(A) op(B), op(X) = X or X^T per MatmulAttrs.
#include <fmt/format.h>

#include "graph/ops/op_common.hpp"

namespace sg::ops {
namespace {

constexpr OpKind kOp = OpKind::matmul;

std::vector<OutputSpec> infer(const Inputs& in, const OpAttrs& attrs) {
  const auto& a = std::get<MatmulAttrs>(attrs);
  expect_arity(kOp, in, 2, 2);
  const Value& A = *in[0];
  const Value& B = *in[1];
  expect_rank(kOp, A, 2);
  expect_rank(kOp, B, 2);
  expect_floating(kOp, A);
  expect_same_dtype(kOp, A, B);
  const auto m = a.trans_a ? A.shape[1] : A.shape[0];
  const auto k_a = a.trans_a ? A.shape[0] : A.shape[1];
  const auto k_b = a.trans_b ? B.shape[1] : B.shape[0];
  const auto n = a.trans_b ? B.shape[0] : B.shape[1];
  if (k_a != k_b)
    fail(kOp, fmt::format("inner dimensions differ: {}{} x {}{} ({} vs {})", describe(A), a.trans_a ? "^T" : "",
                          describe(B), a.trans_b ? "^T" : "", k_a, k_b));
  return {{{m, n}, A.dtype}};
}

// Gradients of C = op(A) op(B) with respect to A and B (dA first: for a layer
// that is dX, so every read of the weight precedes its own gradient).
void gradient(const GradientContext& c) {
  const ValueId a = c.input(0), b = c.input(1), dc = *c.output_grad(0);
  const auto& at = c.node().attr<MatmulAttrs>();
  auto emit = [&](int slot, ValueId lhs, ValueId rhs, bool tl, bool tr) {
    if (!c.needs_grad(slot)) return;
    c.contribute(slot, c.emit(kOp, {lhs, rhs}, MatmulAttrs{tl, tr}, c.input(slot)).front());
  };
  if (!at.trans_a && !at.trans_b) {
    emit(0, dc, b, false, true);  // dA = dC B^T
    emit(1, a, dc, true, false);  // dB = A^T dC
  } else if (!at.trans_a && at.trans_b) {
    emit(0, dc, b, false, false);  // dA = dC B
    emit(1, dc, a, true, false);   // dB = dC^T A
  } else if (at.trans_a && !at.trans_b) {
    emit(0, b, dc, false, true);   // dA = B dC^T
    emit(1, a, dc, false, false);  // dB = A dC
  } else {
    emit(0, b, dc, true, true);  // dA = B^T dC^T
    emit(1, dc, a, true, true);  // dB = dC^T A^T
  }
}

template <typename T>
void cpu(const CpuCall<T>& c) {
  const auto& a = c.node.template attr<MatmulAttrs>();
  const auto m = c.out[0].rows, n = c.out[0].cols;
  const auto k = a.trans_a ? c.in[0].rows : c.in[0].cols;
  ref::matmul(c.in[0].real, c.in[1].real, c.out[0].real, m, n, k, a.trans_a, a.trans_b);
}

}  // namespace

const OpDef& matmul_def() {
  static const OpDef def = with_attrs<MatmulAttrs>({.kind = kOp, .name = "matmul", .infer = &infer,
                                                    .gradient = &gradient, .cpu_f32 = &cpu<float>,
                                                    .cpu_f64 = &cpu<double>});
  return def;
}

}  // namespace sg::ops
