#pragma once
// The step's batch fetch as a launch finds it: the batch_fetch fusion group's
// three nodes (batch_indices, the gather of the u8 image table and the
// gather of the u8 labels into i32), and what they bind on the device. The
// batch_fetch lowering runs them as its own kernel; small_batch_forward and
// the few-channel first layer take them into theirs.
#include <cstdint>
#include <optional>

#include "runtime/cuda/lowering.hpp"

namespace sg::cuda {

struct FetchNodes {
  NodeId indices = -1, images = -1, labels = -1;
};

// The fetch of a batch_fetch group `unit` of u8 tables (labels gathered
// into i32), or nothing.
inline std::optional<FetchNodes> u8_fetch_nodes(const sg::Graph& g, const CoverUnit& unit) {
  if (unit.nodes.size() != 3) return std::nullopt;
  FetchNodes f;
  for (NodeId id : unit.nodes) {
    const Node& n = g.node(id);
    if (n.op == OpKind::batch_indices) f.indices = id;
    else if (n.op == OpKind::gather_rows && g.value(n.outputs[0]).dtype == DType::i32) f.labels = id;
    else if (n.op == OpKind::gather_rows) f.images = id;
  }
  if (f.indices < 0 || f.images < 0 || f.labels < 0) return std::nullopt;
  if (g.value(g.node(f.images).inputs[0]).dtype != DType::u8 || g.value(g.node(f.labels).inputs[0]).dtype != DType::u8)
    return std::nullopt;
  return f;
}

// What the fetch reads and writes: the permutation over `rows` images, the
// step counter, this rank's slice (BatchIndicesAttrs), the image table of
// `cols` bytes a row with its scaling, the labels and their output.
struct BoundFetch {
  const std::int32_t* perm = nullptr;
  std::int64_t rows = 0;
  const std::int32_t* step = nullptr;
  std::int64_t batch = 0, rank = 0, ranks = 1;
  const std::uint8_t* images = nullptr;
  std::int64_t cols = 0;
  float scale = 1.f, shift = 0.f;
  const std::uint8_t* labels = nullptr;
  std::int32_t* labels_out = nullptr;
};

inline BoundFetch bind_fetch(const FetchNodes& f, const BindContext& c) {
  const sg::Graph& g = c.graph();
  const Node& indices = g.node(f.indices);
  const Node& images = g.node(f.images);
  const Node& labels = g.node(f.labels);
  const Value& perm = g.value(indices.inputs[0]);
  const Value& table = g.value(images.inputs[0]);
  const auto& shard = indices.attr<BatchIndicesAttrs>();
  const auto& gather = images.attr<GatherRowsAttrs>();
  BoundFetch b;
  b.perm = static_cast<const std::int32_t*>(c.ptr(perm.id));
  b.rows = perm.shape[0];
  b.step = static_cast<const std::int32_t*>(c.ptr(indices.inputs[1]));
  b.batch = shard.batch;
  b.rank = shard.rank;
  b.ranks = shard.ranks;
  b.images = static_cast<const std::uint8_t*>(c.ptr(table.id));
  b.cols = table.shape[1];
  b.scale = float(gather.scale);
  b.shift = float(gather.shift);
  b.labels = static_cast<const std::uint8_t*>(c.ptr(labels.inputs[0]));
  b.labels_out = static_cast<std::int32_t*>(c.ptr(labels.outputs[0]));
  return b;
}

}  // namespace sg::cuda
