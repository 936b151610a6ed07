#pragma once
// Queries of the lowerings that gather lone nodes (no fusion group) into one
// launch (the CNN's pooling chains, channel sums with their bias update, the
// conv weights' SGD updates): which unit is still free, and which values a
// launch must write because a node outside it reads them.
#include <algorithm>

#include "runtime/plan/schedule.hpp"

namespace sg::cuda {

// The free unit of `node` when it is a lone node (not in a fusion group).
inline const CoverUnit* free_lone_unit(const Cover& cover, NodeId node) {
  if (node < 0) return nullptr;
  const CoverUnit& u = cover.unit_of(node);
  return !cover.taken(u.id) && u.fusion_group < 0 ? &u : nullptr;
}

// Whether the launch must write `v` (a node outside it or the graph's outputs read it).
inline bool launch_writes(const Launch& l, ValueId v) {
  return std::find(l.writes.begin(), l.writes.end(), v) != l.writes.end();
}

}  // namespace sg::cuda
