#pragma once
// Queries of the lowerings that gather lone nodes (no fusion group) into one
// launch (the CNN's pooling chains, channel sums with their bias update, the
// SGD updates, batch norm with its neighbours, the fused updates): which unit
// is still free, which node alone reads a value, and which values a launch
// must write because a node outside it reads them.
#include <algorithm>

#include "runtime/plan/schedule.hpp"

namespace sg::cuda {

// The free unit of `node` when it is a lone node (not in a fusion group).
inline const CoverUnit* free_lone_unit(const Cover& cover, NodeId node) {
  if (node < 0) return nullptr;
  const CoverUnit& u = cover.unit_of(node);
  return !cover.taken(u.id) && u.fusion_group < 0 ? &u : nullptr;
}

// Whether v is one of the graph's outputs (read after the step).
inline bool is_graph_output(const sg::Graph& g, ValueId v) {
  return std::find(g.outputs().begin(), g.outputs().end(), v) != g.outputs().end();
}

// The one node reading `v` when v is no graph output, else -1: a value a
// launch may keep to itself when it takes that node too.
inline NodeId sole_reader(const sg::Graph& g, ValueId v) {
  const auto& readers = g.consumers(v);
  return readers.size() == 1 && !is_graph_output(g, v) ? readers[0] : -1;
}

// The free unit of v's sole reader when that is a lone `op` node.
inline const CoverUnit* free_sole_reader(const Cover& cover, ValueId v, OpKind op) {
  const NodeId reader = sole_reader(cover.graph(), v);
  return reader >= 0 && cover.graph().node(reader).op == op ? free_lone_unit(cover, reader) : nullptr;
}

// Whether the launch must write `v` (a node outside it or the graph's outputs read it).
inline bool launch_writes(const Launch& l, ValueId v) {
  return std::find(l.writes.begin(), l.writes.end(), v) != l.writes.end();
}

}  // namespace sg::cuda
