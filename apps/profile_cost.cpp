#include "apps/profile_cost.hpp"

#include <algorithm>
#include <set>

#include "graph/dtype.hpp"

namespace sg::app {
namespace {

double value_bytes(const Graph& g, ValueId id) {
  return double(sg::value_bytes(g.value(id)));
}

// Bytes a read of `id` moves for the nodes of the launch: a gather's table
// or batch_indices' permutation only as much as the node's output.
double read_bytes(const Graph& g, const std::vector<NodeId>& nodes, ValueId id) {
  double indexed = -1;
  for (NodeId n : nodes) {
    const Node& node = g.node(n);
    if ((node.op == OpKind::gather_rows || node.op == OpKind::batch_indices) && !node.inputs.empty() &&
        node.inputs[0] == id && !node.outputs.empty())
      indexed = std::max(indexed, value_bytes(g, node.outputs[0]));
  }
  return indexed >= 0 ? indexed : value_bytes(g, id);
}

double matmul_flops(const Graph& g, const std::vector<NodeId>& nodes) {
  double flops = 0;
  for (NodeId n : nodes) {
    const Node& node = g.node(n);
    if (node.op != OpKind::matmul || node.outputs.empty() || node.inputs.size() < 2) continue;
    const Shape& out = g.value(node.outputs[0]).shape;
    if (out.size() != 2 || out[0] == 0) continue;
    const double k = double(element_count(g.value(node.inputs[0]).shape)) / double(out[0]);  // A holds m*k
    flops += 2.0 * double(element_count(out)) * k;
  }
  return flops;
}

}  // namespace

LaunchCost launch_cost(const Graph& g, const std::vector<NodeId>& nodes, const std::vector<ValueId>& reads,
                       const std::vector<ValueId>& writes, const std::vector<ValueId>& updates) {
  LaunchCost c;
  for (ValueId v : reads) c.bytes += read_bytes(g, nodes, v);
  for (ValueId v : writes) c.bytes += value_bytes(g, v);
  for (ValueId v : updates) c.bytes += 2 * value_bytes(g, v);
  c.flops = matmul_flops(g, nodes);
  return c;
}

LaunchCost nodes_cost(const Graph& g, const std::vector<NodeId>& nodes) {
  std::set<ValueId> produced, reads, writes, updates;
  for (NodeId n : nodes) {
    const Node& node = g.node(n);
    const auto in_place = in_place_inputs(node);
    for (std::size_t i = 0; i < node.inputs.size(); ++i) {
      const ValueId v = node.inputs[i];
      if (std::find(in_place.begin(), in_place.end(), int(i)) != in_place.end()) updates.insert(v);
      else if (!produced.count(v)) reads.insert(v);
    }
    for (ValueId v : node.outputs) {
      produced.insert(v);
      writes.insert(v);
    }
  }
  for (ValueId v : updates) reads.erase(v);
  return launch_cost(g, nodes, {reads.begin(), reads.end()}, {writes.begin(), writes.end()}, {updates.begin(), updates.end()});
}

}  // namespace sg::app
