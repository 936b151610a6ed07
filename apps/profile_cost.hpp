#pragma once
// Bytes moved and FLOPs of a set of graph nodes run as one launch, read off
// the graph: FLOPs count matmuls only (2*m*n*k); bytes are the sizes of the
// values read from outside the set, written for use outside it, and updated
// in place (counted twice: read and written). A gather reads only the rows
// it fetches (its output's size), not the whole table; batch_indices reads
// B entries of the permutation.
#include <vector>

#include "graph/graph.hpp"

namespace sg::app {

struct LaunchCost {
  double bytes = 0, flops = 0;
};

// reads/writes/updates as the scheduler's Launch lists them.
LaunchCost launch_cost(const Graph& g, const std::vector<NodeId>& nodes, const std::vector<ValueId>& reads,
                       const std::vector<ValueId>& writes, const std::vector<ValueId>& updates);
// Same, deriving reads/writes/updates from the nodes: every output is written
// (the CPU executor keeps every value in memory).
LaunchCost nodes_cost(const Graph& g, const std::vector<NodeId>& nodes);

}  // namespace sg::app
