// gather_rows: (table [N,D] or [N], idx i32[B]) -> [B,D] or [B],
// out = table[idx] * scale + shift (integer outputs: no scaling).
#include <fmt/format.h>

#include "graph/ops/op_common.hpp"

namespace sg::ops {
namespace {

constexpr OpKind kOp = OpKind::gather_rows;

std::vector<OutputSpec> infer(const Inputs& in, const OpAttrs& attrs) {
  const auto& a = std::get<GatherRowsAttrs>(attrs);
  expect_arity(kOp, in, 2, 2);
  const Value& table = *in[0];
  const Value& idx = *in[1];
  if (table.shape.empty() || table.shape.size() > 2)
    fail(kOp, fmt::format("table {} must have rank 1 or 2", describe(table)));
  expect_rank(kOp, idx, 1);
  if (idx.dtype != DType::i32) fail(kOp, fmt::format("indices {} must be i32", describe(idx)));
  if (!is_floating(a.out_dtype) && a.out_dtype != DType::i32) fail(kOp, "out dtype must be f32, f16, bf16 or i32");
  if (a.out_dtype == DType::i32 && is_floating(table.dtype))
    fail(kOp, fmt::format("cannot gather floating table {} into i32", describe(table)));
  Shape out = table.shape;
  out[0] = idx.shape[0];
  return {{out, a.out_dtype}};
}

template <typename T>
void cpu(const CpuCall<T>& c) {
  const auto& a = c.node.template attr<GatherRowsAttrs>();
  const CpuTensor<T>& table = c.in[0];
  const CpuTensor<T>& out = c.out[0];
  const auto cols = table.cols;
  const auto rows = c.in[1].size;
  const std::int32_t* idx = c.in[1].i32;
  for (std::int64_t i = 0; i < rows; ++i)
    if (idx[i] < 0 || idx[i] >= table.rows)
      throw GraphError(fmt::format("gather_rows: index {} outside table of {} rows", idx[i], table.rows));
  if (out.dtype == DType::i32) {
    if (table.dtype == DType::u8) ref::gather_rows_int(table.u8, idx, rows, cols, out.i32);
    else ref::gather_rows_int(table.i32, idx, rows, cols, out.i32);
  } else if (table.dtype == DType::u8) {
    ref::gather_rows(table.u8, idx, rows, cols, T(a.scale), T(a.shift), out.real);
  } else if (table.dtype == DType::i32) {
    ref::gather_rows(table.i32, idx, rows, cols, T(a.scale), T(a.shift), out.real);
  } else {
    ref::gather_rows(table.real, idx, rows, cols, T(a.scale), T(a.shift), out.real);
  }
}

}  // namespace

const OpDef& gather_rows_def() {
  static const OpDef def = with_attrs<GatherRowsAttrs>(
      {.kind = kOp, .name = "gather_rows", .infer = &infer, .cpu_f32 = &cpu<float>, .cpu_f64 = &cpu<double>});
  return def;
}

}  // namespace sg::ops
