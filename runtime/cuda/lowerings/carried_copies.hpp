#pragma once
// An fp32 master weight's f16/bf16 compute copy written by its update for the
// next step (Launch::carries), instead of a cast at the step's start: the
// update has the new value in registers, so the copy costs it a 2-byte store
// an element where the cast launch reads 4 and writes 2 again, on the way to
// the first matmul (784-2048-2048-10's 5.8M weights: 13.7 us of cast_params).
// The update lowering takes the parameter's cast node (a free lone unit) and
// carries its output; the program fills the copies once the host has written
// the parameters (RecordedLaunch::parameters_written), before any step.
// Only for parameters of kCarriedElements or more: a smaller tensor's cast
// runs beside the batch fetch on the second stream at no cost, and carrying
// mnist_cnn_fast's and gelu3_adamw's filters made their steps 1-3 us slower
// (H200, docs/benchmarks.md). Not for a sharded update (ZeRO-1), which
// writes a part of the parameter.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <functional>
#include <vector>

#include "ops/cuda/cast_params.hpp"
#include "ops/cuda/update_rules/multi_tensor_update.hpp"
#include "runtime/cuda/lowerings/lone_units.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"
#include "runtime/plan/graph_queries.hpp"

namespace sg::cuda {

// 2^20 elements: a cast of 6 MB or more, ~1.5 us, which no longer hides behind the batch fetch.
constexpr std::int64_t kCarriedElements = std::int64_t(1) << 20;

// The cast of `param` (an fp32 parameter, updated whole from the gradient
// `grad_read`) to its compute copy that an update launch may carry; -1: none.
inline NodeId carried_cast(const Cover& cover, ValueId param, ValueId grad_read) {
  const sg::Graph& g = cover.graph();
  const Value& p = g.value(param);
  if (p.dtype != DType::f32 || element_count(p.shape) < kCarriedElements || gradient_shards(g, grad_read) > 1)
    return -1;
  for (NodeId reader : g.consumers(param)) {
    const Node& n = g.node(reader);
    if (param_cast_to(g, n) && free_lone_unit(cover, reader) && !is_graph_output(g, n.outputs[0])) return reader;
  }
  return -1;
}

// Where the update kernel writes the copy of a carried cast (-1: none).
inline ComputeCopy compute_copy(const BindContext& c, NodeId cast) {
  if (cast < 0) return {};
  const ValueId out = c.graph().node(cast).outputs[0];
  return {c.ptr(out), c.graph().value(out).dtype == DType::f16 ? CopyType::f16 : CopyType::bf16};
}

// The copies filled from their masters (the carried casts' work outside the
// step): empty when `casts` has none.
inline std::function<void(cudaStream_t)> fill_compute_copies(const BindContext& c, const std::vector<NodeId>& casts) {
  std::vector<CastTensor<__half>> halves;
  std::vector<CastTensor<__nv_bfloat16>> bfloats;
  for (NodeId id : casts) {
    if (id < 0) continue;
    const Node& n = c.graph().node(id);
    const auto* source = static_cast<const float*>(c.ptr(n.inputs[0]));
    const std::int64_t count = element_count(c.graph().value(n.inputs[0]).shape);
    if (compute_copy(c, id).type == CopyType::f16)
      halves.push_back({source, static_cast<__half*>(c.ptr(n.outputs[0])), count});
    else
      bfloats.push_back({source, static_cast<__nv_bfloat16*>(c.ptr(n.outputs[0])), count});
  }
  if (halves.empty() && bfloats.empty()) return {};
  return [halves, bfloats](cudaStream_t s) {
    if (!halves.empty()) launch_cast_params(halves, s);
    if (!bfloats.empty()) launch_cast_params(bfloats, s);
  };
}

}  // namespace sg::cuda
