#pragma once
// Human- and machine-readable views of a graph: text (one line per node),
// JSON (round-trips through graph_from_json) and Graphviz DOT with fusion
// groups drawn as clusters.
#include <string>

#include "graph/graph.hpp"

namespace sg {

std::string dump_text(const Graph& graph);
std::string dump_json(const Graph& graph);       // pretty-printed
Graph graph_from_json(const std::string& text);  // throws GraphError; verifies the result
std::string dump_dot(const Graph& graph, const std::string& title = "stepgraph");

}  // namespace sg
