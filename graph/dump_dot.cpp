#include <fmt/format.h>

#include "graph/dump.hpp"
#include "graph/op_registry.hpp"

namespace sg {
namespace {

enum class Phase { forward, backward, update };

Phase phase_of(const Graph& g, const Node& n) {
  if (op_updates_in_place(n.op)) return Phase::update;
  for (ValueId o : n.outputs)
    if (g.value(o).role == Role::grad) return Phase::backward;
  return Phase::forward;
}

const char* phase_color(Phase p) {
  switch (p) {
    case Phase::forward: return "#dbe9f6";
    case Phase::backward: return "#f6e0db";
    case Phase::update: return "#def2d9";
  }
  return "white";
}

const char* role_color(Role r) {
  switch (r) {
    case Role::param: return "#f7d774";
    case Role::state: return "#c9b3e6";
    case Role::input:
    case Role::label: return "#bfe3c0";
    default: return "white";
  }
}

std::string op_box(const Graph& g, const Node& n) {
  std::string label = fmt::format("n{} {}", n.id, op_name(n.op));
  if (const std::string attrs = attrs_text(n.op, n.attrs); !attrs.empty())
    label += "\\n" + attrs.substr(1);  // "{trans_a=false,trans_b=true}"
  return fmt::format("  n{} [shape=box, style=filled, fillcolor=\"{}\", label=\"{}\"];\n", n.id,
                     phase_color(phase_of(g, n)), label);
}

}  // namespace

std::string dump_dot(const Graph& g, const std::string& title) {
  std::string out = fmt::format("digraph \"{}\" {{\n  rankdir=TB;\n  node [fontname=\"Helvetica\", fontsize=10];\n", title);
  for (const Value& v : g.values())
    out += fmt::format("  v{} [shape=ellipse, style=filled, fillcolor=\"{}\", label=\"{}\\n{}{}\"];\n", v.id,
                       role_color(v.role), v.name, shape_string(v.shape), dtype_name(v.dtype));
  for (const FusionGroup& fg : g.fusion_groups()) {
    out += fmt::format("  subgraph cluster_{} {{\n    label=\"{}#{}\"; style=dashed; color=\"#555555\";\n", fg.id,
                       fusion_name(fg.kind), fg.id);
    for (NodeId n : fg.nodes) out += "  " + op_box(g, g.node(n));
    out += "  }\n";
  }
  for (const Node& n : g.nodes())
    if (n.fusion_group < 0) out += op_box(g, n);
  for (const Node& n : g.nodes()) {
    for (ValueId in : n.inputs) out += fmt::format("  v{} -> n{};\n", in, n.id);
    for (ValueId o : n.outputs) out += fmt::format("  n{} -> v{};\n", n.id, o);
    for (int slot : in_place_inputs(n))
      out += fmt::format("  n{} -> v{} [style=dotted, label=\"updates\"];\n", n.id, n.inputs[static_cast<std::size_t>(slot)]);
  }
  out += "}\n";
  return out;
}

}  // namespace sg
