#include <fmt/format.h>
#include <fmt/ranges.h>

#include "graph/dump.hpp"
#include "graph/op_registry.hpp"

namespace sg {
namespace {

std::string typed(const Value& v) { return fmt::format("{}{}", shape_string(v.shape), dtype_name(v.dtype)); }

}  // namespace

std::string dump_text(const Graph& g) {
  std::string out = fmt::format("# {} values, {} nodes, {} fusion groups\n", g.values().size(), g.nodes().size(),
                                g.fusion_groups().size());
  for (const Value& v : g.values())
    if (is_graph_owned(v.role)) out += fmt::format("%{} {} {} {}\n", v.id, v.name, role_name(v.role), typed(v));
  for (const Node& n : g.nodes()) {
    std::vector<std::string> ins, outs;
    for (ValueId i : n.inputs) ins.push_back(g.value(i).name);
    for (ValueId o : n.outputs) outs.push_back(fmt::format("{}:{}", g.value(o).name, typed(g.value(o))));
    std::string fused = "-";
    if (n.fusion_group >= 0) {
      const auto& group = g.fusion_groups()[static_cast<std::size_t>(n.fusion_group)];
      fused = fmt::format("{}#{}", fusion_name(group.kind), group.id);
    }
    out += fmt::format("n{} {}({}) -> {}{} fused={}\n", n.id, op_name(n.op), fmt::join(ins, ", "),
                       outs.empty() ? std::string("(in place)") : fmt::format("{}", fmt::join(outs, ", ")),
                       attrs_text(n.op, n.attrs), fused);
  }
  if (!g.outputs().empty()) {
    std::vector<std::string> names;
    for (ValueId o : g.outputs()) names.push_back(g.value(o).name);
    out += fmt::format("outputs: {}\n", fmt::join(names, ", "));
  }
  return out;
}

}  // namespace sg
