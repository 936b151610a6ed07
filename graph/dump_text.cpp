#include <fmt/format.h>
#include <fmt/ranges.h>

#include "graph/dump.hpp"

namespace sg {
namespace {

std::string typed(const Value& v) { return fmt::format("{}{}", shape_string(v.shape), dtype_name(v.dtype)); }

// Only the attributes an op actually reads, so lines stay short.
std::string attrs_text(const Node& n) {
  const OpAttrs& a = n.attrs;
  switch (n.op) {
    case OpKind::matmul:
      return fmt::format(" {{trans_a={},trans_b={}}}", a.trans_a, a.trans_b);
    case OpKind::batch_indices:
      return fmt::format(" {{batch={}}}", a.batch);
    case OpKind::gather_rows:
      return fmt::format(" {{scale={:.6g},shift={:.6g}}}", a.scale, a.shift);
    case OpKind::sgd_update:
      return fmt::format(" {{lr={:.6g},momentum={:.6g},weight_decay={:.6g}}}", a.lr, a.momentum, a.weight_decay);
    default:
      return "";
  }
}

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
                       attrs_text(n), fused);
  }
  if (!g.outputs().empty()) {
    std::vector<std::string> names;
    for (ValueId o : g.outputs()) names.push_back(g.value(o).name);
    out += fmt::format("outputs: {}\n", fmt::join(names, ", "));
  }
  return out;
}

}  // namespace sg
