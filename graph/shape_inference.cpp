#include "graph/shape_inference.hpp"

#include <fmt/format.h>

#include "graph/graph.hpp"

namespace sg {
namespace {

[[noreturn]] void fail(OpKind op, const std::string& what) {
  throw GraphError(fmt::format("{}: {}", op_name(op), what));
}

std::string describe(const Value& v) {
  return fmt::format("'{}' {} {}", v.name, shape_string(v.shape), dtype_name(v.dtype));
}

void expect_arity(OpKind op, const std::vector<const Value*>& in, std::size_t lo, std::size_t hi) {
  if (in.size() < lo || in.size() > hi)
    fail(op, fmt::format("expects {} inputs, got {}", lo == hi ? fmt::format("{}", lo)
                                                               : fmt::format("{}..{}", lo, hi),
                         in.size()));
}

void expect_rank(OpKind op, const Value& v, std::size_t rank) {
  if (v.shape.size() != rank)
    fail(op, fmt::format("{} must have rank {}", describe(v), rank));
}

void expect_floating(OpKind op, const Value& v) {
  if (!is_floating(v.dtype)) fail(op, fmt::format("{} must be f32 or f16", describe(v)));
}

void expect_same_dtype(OpKind op, const Value& a, const Value& b) {
  if (a.dtype != b.dtype) fail(op, fmt::format("dtype mismatch: {} vs {}", describe(a), describe(b)));
}

void expect_same_shape(OpKind op, const Value& a, const Value& b) {
  if (a.shape != b.shape) fail(op, fmt::format("shape mismatch: {} vs {}", describe(a), describe(b)));
}

void expect_labels_for(OpKind op, const Value& logits, const Value& labels) {
  expect_rank(op, logits, 2);
  expect_floating(op, logits);
  expect_rank(op, labels, 1);
  if (labels.dtype != DType::i32) fail(op, fmt::format("labels {} must be i32", describe(labels)));
  if (labels.shape[0] != logits.shape[0])
    fail(op, fmt::format("batch mismatch: logits {} vs labels {}", describe(logits), describe(labels)));
}

std::vector<OutputSpec> infer_matmul(const std::vector<const Value*>& in, const OpAttrs& a) {
  const Value& A = *in[0];
  const Value& B = *in[1];
  expect_rank(OpKind::matmul, A, 2);
  expect_rank(OpKind::matmul, B, 2);
  expect_floating(OpKind::matmul, A);
  expect_same_dtype(OpKind::matmul, A, B);
  const auto m = a.trans_a ? A.shape[1] : A.shape[0];
  const auto k_a = a.trans_a ? A.shape[0] : A.shape[1];
  const auto k_b = a.trans_b ? B.shape[1] : B.shape[0];
  const auto n = a.trans_b ? B.shape[0] : B.shape[1];
  if (k_a != k_b)
    fail(OpKind::matmul, fmt::format("inner dimensions differ: {}{} x {}{} ({} vs {})", describe(A),
                                     a.trans_a ? "^T" : "", describe(B), a.trans_b ? "^T" : "", k_a,
                                     k_b));
  return {{{m, n}, A.dtype}};
}

}  // namespace

std::vector<OutputSpec> infer_outputs(OpKind op, const std::vector<const Value*>& in,
                                      const OpAttrs& attrs) {
  switch (op) {
    case OpKind::batch_indices: {
      expect_arity(op, in, 2, 2);
      expect_rank(op, *in[0], 1);
      if (in[0]->dtype != DType::i32 || in[1]->dtype != DType::i32)
        fail(op, "perm and step must be i32");
      if (in[1]->shape != Shape{1}) fail(op, fmt::format("step {} must have shape [1]", describe(*in[1])));
      if (attrs.batch <= 0 || attrs.batch > in[0]->shape[0])
        fail(op, fmt::format("batch {} must be in 1..{} (rows of {})", attrs.batch, in[0]->shape[0],
                             describe(*in[0])));
      return {{{attrs.batch}, DType::i32}};
    }
    case OpKind::gather_rows: {
      expect_arity(op, in, 2, 2);
      const Value& table = *in[0];
      const Value& idx = *in[1];
      if (table.shape.empty() || table.shape.size() > 2)
        fail(op, fmt::format("table {} must have rank 1 or 2", describe(table)));
      expect_rank(op, idx, 1);
      if (idx.dtype != DType::i32) fail(op, fmt::format("indices {} must be i32", describe(idx)));
      if (!is_floating(attrs.out_dtype) && attrs.out_dtype != DType::i32)
        fail(op, "out dtype must be f32, f16 or i32");
      if (attrs.out_dtype == DType::i32 && is_floating(table.dtype))
        fail(op, fmt::format("cannot gather floating table {} into i32", describe(table)));
      Shape out = table.shape;
      out[0] = idx.shape[0];
      return {{out, attrs.out_dtype}};
    }
    case OpKind::matmul:
      expect_arity(op, in, 2, 2);
      return infer_matmul(in, attrs);
    case OpKind::bias_add: {
      expect_arity(op, in, 2, 2);
      expect_rank(op, *in[0], 2);
      expect_rank(op, *in[1], 1);
      expect_floating(op, *in[0]);
      expect_same_dtype(op, *in[0], *in[1]);
      if (in[1]->shape[0] != in[0]->shape[1])
        fail(op, fmt::format("bias {} does not match columns of {}", describe(*in[1]), describe(*in[0])));
      return {{in[0]->shape, in[0]->dtype}};
    }
    case OpKind::relu:
      expect_arity(op, in, 1, 1);
      expect_floating(op, *in[0]);
      return {{in[0]->shape, in[0]->dtype}};
    case OpKind::relu_backward:
    case OpKind::add:
      expect_arity(op, in, 2, 2);
      expect_floating(op, *in[0]);
      expect_same_shape(op, *in[0], *in[1]);
      expect_same_dtype(op, *in[0], *in[1]);
      return {{in[0]->shape, in[0]->dtype}};
    case OpKind::softmax_xent:
      expect_arity(op, in, 2, 2);
      expect_labels_for(op, *in[0], *in[1]);
      return {{{1}, DType::f32}};
    case OpKind::softmax_xent_backward:
      expect_arity(op, in, 2, 2);
      expect_labels_for(op, *in[0], *in[1]);
      return {{in[0]->shape, in[0]->dtype}};
    case OpKind::count_correct:
      expect_arity(op, in, 2, 2);
      expect_labels_for(op, *in[0], *in[1]);
      return {{{1}, DType::i32}};
    case OpKind::reduce_rows:
      expect_arity(op, in, 1, 1);
      expect_rank(op, *in[0], 2);
      expect_floating(op, *in[0]);
      return {{{in[0]->shape[1]}, in[0]->dtype}};
    case OpKind::cast:
      expect_arity(op, in, 1, 1);
      expect_floating(op, *in[0]);
      if (!is_floating(attrs.out_dtype)) fail(op, "cast target must be f32 or f16");
      return {{in[0]->shape, attrs.out_dtype}};
    case OpKind::sgd_update: {
      expect_arity(op, in, 2, 3);
      expect_floating(op, *in[0]);
      expect_same_shape(op, *in[0], *in[1]);
      expect_same_dtype(op, *in[0], *in[1]);
      if (in.size() == 3) {
        expect_same_shape(op, *in[0], *in[2]);
        if (attrs.momentum == 0.0) fail(op, "a velocity input needs momentum > 0");
      } else if (attrs.momentum != 0.0) {
        fail(op, "momentum > 0 needs a velocity input");
      }
      if (!(attrs.lr > 0.0)) fail(op, fmt::format("learning rate {} must be > 0", attrs.lr));
      return {};
    }
    case OpKind::advance_step:
      expect_arity(op, in, 1, 1);
      if (in[0]->dtype != DType::i32 || in[0]->shape != Shape{1})
        fail(op, fmt::format("step {} must be i32 [1]", describe(*in[0])));
      return {};
  }
  fail(op, "unknown op");
}

}  // namespace sg
