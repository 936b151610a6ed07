#pragma once
// Structural checks of a graph: ids consistent, every value defined once,
// inputs defined before use (acyclic), shapes/dtypes re-inferred and equal,
// in-place updates only on params/state and never followed by a read.
#include <string>
#include <vector>

#include "graph/graph.hpp"

namespace sg {

std::vector<std::string> find_graph_problems(const Graph& graph);
// Throws GraphError listing every problem.
void verify_graph(const Graph& graph);

}  // namespace sg
