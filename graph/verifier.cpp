#include "graph/verifier.hpp"

#include <algorithm>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "graph/shape_inference.hpp"

namespace sg {
namespace {

using Problems = std::vector<std::string>;

void check_values(const Graph& g, Problems& out) {
  std::set<std::string> names;
  for (std::size_t i = 0; i < g.values().size(); ++i) {
    const Value& v = g.values()[i];
    if (v.id != static_cast<ValueId>(i)) out.push_back(fmt::format("value '{}' has id {} at index {}", v.name, v.id, i));
    if (!names.insert(v.name).second) out.push_back(fmt::format("value name '{}' is used twice", v.name));
    if (is_graph_owned(v.role) && v.producer != -1)
      out.push_back(fmt::format("{} value '{}' must not have a producer", role_name(v.role), v.name));
    if (!is_graph_owned(v.role)) {
      if (v.producer < 0 || static_cast<std::size_t>(v.producer) >= g.nodes().size()) {
        out.push_back(fmt::format("value '{}' has no producer", v.name));
        continue;
      }
      const auto& outs = g.node(v.producer).outputs;
      if (std::find(outs.begin(), outs.end(), v.id) == outs.end())
        out.push_back(fmt::format("value '{}' names node {} as producer, which does not output it", v.name, v.producer));
    }
  }
}

bool defined_before(const Graph& g, ValueId id, NodeId node) {
  const Value& v = g.value(id);
  return is_graph_owned(v.role) || (v.producer >= 0 && v.producer < node);
}

void check_node(const Graph& g, const Node& n, std::set<ValueId>& produced, std::set<ValueId>& updated,
                Problems& out) {
  const auto where = fmt::format("node {} ({})", n.id, op_name(n.op));
  std::vector<const Value*> inputs;
  for (ValueId in : n.inputs) {
    if (in < 0 || static_cast<std::size_t>(in) >= g.values().size()) {
      out.push_back(fmt::format("{}: input id {} does not exist", where, in));
      return;
    }
    if (!defined_before(g, in, n.id)) out.push_back(fmt::format("{}: input '{}' is used before it is defined", where, g.value(in).name));
    if (updated.count(in)) out.push_back(fmt::format("{}: reads '{}' after its in-place update", where, g.value(in).name));
    inputs.push_back(&g.value(in));
  }
  for (ValueId o : n.outputs)
    if (!produced.insert(o).second) out.push_back(fmt::format("{}: output '{}' is defined twice", where, g.value(o).name));
  try {
    const auto specs = infer_outputs(n.op, inputs, n.attrs);
    if (specs.size() != n.outputs.size()) {
      out.push_back(fmt::format("{}: has {} outputs, expected {}", where, n.outputs.size(), specs.size()));
    } else {
      for (std::size_t i = 0; i < specs.size(); ++i) {
        const Value& v = g.value(n.outputs[i]);
        if (v.shape != specs[i].shape || v.dtype != specs[i].dtype)
          out.push_back(fmt::format("{}: output '{}' is {} {}, inference says {} {}", where, v.name,
                                    shape_string(v.shape), dtype_name(v.dtype), shape_string(specs[i].shape),
                                    dtype_name(specs[i].dtype)));
      }
    }
  } catch (const std::exception& e) {
    out.push_back(fmt::format("{}: {}", where, e.what()));
  }
  for (int slot : in_place_inputs(n)) {
    const Value& target = g.value(n.inputs[static_cast<std::size_t>(slot)]);
    if (target.role != Role::param && target.role != Role::state)
      out.push_back(fmt::format("{}: updates {} value '{}' in place (only param/state may be)", where,
                                role_name(target.role), target.name));
    if (!updated.insert(target.id).second)
      out.push_back(fmt::format("{}: '{}' is updated twice in one step", where, target.name));
  }
}

void check_groups(const Graph& g, Problems& out) {
  for (std::size_t gi = 0; gi < g.fusion_groups().size(); ++gi) {
    const auto& group = g.fusion_groups()[gi];
    if (group.nodes.empty()) out.push_back(fmt::format("fusion group {} is empty", gi));
    for (NodeId id : group.nodes) {
      if (id < 0 || static_cast<std::size_t>(id) >= g.nodes().size()) {
        out.push_back(fmt::format("fusion group {} names missing node {}", gi, id));
      } else if (g.node(id).fusion_group != static_cast<int>(gi)) {
        out.push_back(fmt::format("node {} is in fusion group {} but says {}", id, gi, g.node(id).fusion_group));
      }
    }
  }
}

}  // namespace

std::vector<std::string> find_graph_problems(const Graph& g) {
  Problems out;
  check_values(g, out);
  std::set<ValueId> produced;
  std::set<ValueId> updated;
  for (std::size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (n.id != static_cast<NodeId>(i)) out.push_back(fmt::format("node at index {} has id {}", i, n.id));
    check_node(g, n, produced, updated, out);
  }
  check_groups(g, out);
  for (ValueId o : g.outputs())
    if (o < 0 || static_cast<std::size_t>(o) >= g.values().size()) out.push_back(fmt::format("output id {} does not exist", o));
  return out;
}

void verify_graph(const Graph& g) {
  const auto problems = find_graph_problems(g);
  if (!problems.empty()) throw GraphError(fmt::format("invalid graph: {}", fmt::join(problems, "; ")));
}

}  // namespace sg
