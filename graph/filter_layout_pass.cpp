#include "graph/filter_layout_pass.hpp"

#include <unordered_map>

namespace sg {

int use_channels_last_filters(Graph& graph, std::int64_t min_channels) {
  std::unordered_map<ValueId, ValueId> copies;  // filter -> its [O,KH,KW,C] copy
  for (std::size_t i = 0; i < graph.nodes().size(); ++i) {
    const Node& n = graph.node(static_cast<NodeId>(i));
    if (n.op != OpKind::conv2d && n.op != OpKind::conv2d_backward_data) continue;
    auto attrs = n.attr<Conv2dAttrs>();
    if (!attrs.channels_last || attrs.filter_channels_last) continue;
    const ValueId filter = n.inputs[1];
    const Value& w = graph.value(filter);
    if (w.shape.size() != 4 || w.shape[1] < min_channels) continue;
    auto copy = copies.find(filter);
    if (copy == copies.end()) {
      // Right before its first reader: shifts this node (and every later one) by one.
      const ValueId made =
          graph.insert_node(i, OpKind::to_channels_last, {filter}, NoAttrs{}, Role::activation, w.name + "_krsc")
              .front();
      copy = copies.emplace(filter, made).first;
      ++i;
    }
    std::vector<ValueId> inputs = graph.node(static_cast<NodeId>(i)).inputs;
    inputs[1] = copy->second;
    attrs.filter_channels_last = true;
    graph.rewire(static_cast<NodeId>(i), std::move(inputs), attrs);
  }
  return static_cast<int>(copies.size());
}

}  // namespace sg
