#pragma once
// The op set of the IR. Each op's exact semantics live next to its CPU
// reference kernel in ops/cpu/reference_ops.hpp; both backends implement them.
#include <cstdint>
#include <string_view>
#include <vector>

#include "graph/dtype.hpp"
#include "graph/value.hpp"

namespace sg {

enum class OpKind : std::uint8_t {
  batch_indices,          // (perm i32[N], step i32[1]) -> idx i32[B]
  gather_rows,            // (table [N,D] or [N], idx i32[B]) -> [B,D] or [B]
  matmul,                 // (A, B) -> op(A) op(B)
  bias_add,               // (X [M,N], b [N]) -> X + b
  relu,                   // X -> max(X, 0)
  relu_backward,          // (dY, Y) -> dY * (Y > 0)
  softmax_xent,           // (logits [B,C], labels i32[B]) -> mean loss f32[1]
  softmax_xent_backward,  // (logits, labels) -> (softmax - onehot) / B
  reduce_rows,            // X [M,N] -> column sums [N]
  add,                    // (X, Y) -> X + Y   (gradient accumulation)
  cast,                   // X -> X in attrs.out_dtype
  sgd_update,             // (param, grad[, velocity]) -> nothing; updates in place
  advance_step,           // step i32[1] -> nothing; step += 1 in place
  count_correct,          // (logits [B,C], labels i32[B]) -> i32[1] argmax hits
};

std::string_view op_name(OpKind op);
OpKind op_from_name(std::string_view name);  // throws std::invalid_argument
// Ops with no outputs that write some of their inputs in place.
bool op_updates_in_place(OpKind op);
// Input slots an in-place op writes (sgd_update: param and velocity).
std::vector<int> in_place_inputs(OpKind op, int input_count);

// One flat attribute record: every op reads the fields it needs, the rest keep
// their defaults. Flat keeps dumps, JSON round trips and equality trivial.
struct OpAttrs {
  bool trans_a = false;        // matmul
  bool trans_b = false;        // matmul
  std::int64_t batch = 0;      // batch_indices
  DType out_dtype = DType::f32;  // gather_rows, cast
  double scale = 1.0;          // gather_rows: out = in * scale + shift
  double shift = 0.0;
  double lr = 0.0;             // sgd_update
  double momentum = 0.0;
  double weight_decay = 0.0;

  bool operator==(const OpAttrs&) const = default;
};

// Patterns the fusion pass recognises; a backend lowers each group to one
// kernel (or one cuBLASLt call plus at most one element-wise kernel).
enum class FusionKind : std::uint8_t {
  batch_fetch,     // batch_indices + gather_rows...
  linear_forward,  // matmul + bias_add [+ relu]
  dgrad_drelu,     // matmul producing dY + relu_backward
  wgrad_sgd,       // matmul producing a weight gradient [+ cast] + sgd_update
  bgrad_sgd,       // reduce_rows producing a bias gradient [+ cast] + sgd_update
  xent_fused,      // softmax_xent + softmax_xent_backward
};

std::string_view fusion_name(FusionKind kind);
FusionKind fusion_from_name(std::string_view name);  // throws std::invalid_argument

struct Node {
  NodeId id = -1;
  OpKind op = OpKind::add;
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
  OpAttrs attrs;
  int fusion_group = -1;  // index into Graph::fusion_groups(), -1 when alone

  bool operator==(const Node&) const = default;
};

struct FusionGroup {
  int id = -1;
  FusionKind kind = FusionKind::linear_forward;
  std::vector<NodeId> nodes;  // in graph order

  bool operator==(const FusionGroup&) const = default;
};

}  // namespace sg
