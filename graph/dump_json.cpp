#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "graph/dump.hpp"
#include "graph/op_registry.hpp"
#include "graph/verifier.hpp"

namespace sg {
namespace {

using nlohmann::json;

// The graph's own format; v1 (one flat attribute record per node, with an
// SGD learning rate) still loads: each op reads only its own fields.
constexpr const char* kFormat = "stepgraph-graph-v2";
constexpr const char* kFormatV1 = "stepgraph-graph-v1";

}  // namespace

std::string dump_json(const Graph& g) {
  json values = json::array();
  for (const Value& v : g.values())
    values.push_back({{"id", v.id}, {"name", v.name}, {"shape", v.shape}, {"dtype", dtype_name(v.dtype)},
                      {"role", role_name(v.role)}, {"producer", v.producer}});
  json nodes = json::array();
  for (const Node& n : g.nodes())
    nodes.push_back({{"id", n.id}, {"op", op_name(n.op)}, {"inputs", n.inputs}, {"outputs", n.outputs},
                     {"attrs", attrs_to_json(n.op, n.attrs)}, {"fusion_group", n.fusion_group}});
  json groups = json::array();
  for (const FusionGroup& fg : g.fusion_groups())
    groups.push_back({{"id", fg.id}, {"kind", fusion_name(fg.kind)}, {"nodes", fg.nodes}});
  const json doc = {{"format", kFormat}, {"values", values}, {"nodes", nodes},
                    {"fusion_groups", groups}, {"outputs", g.outputs()}};
  return doc.dump(2) + "\n";
}

Graph graph_from_json(const std::string& text) {
  Graph g;
  try {
    const json doc = json::parse(text);
    if (doc.at("format") != kFormat && doc.at("format") != kFormatV1) throw GraphError("graph JSON: unknown format");
    for (const json& v : doc.at("values"))
      g.add_value_raw(Value{-1, v.at("name").get<std::string>(), v.at("shape").get<Shape>(),
                            dtype_from_name(v.at("dtype").get<std::string>()),
                            role_from_name(v.at("role").get<std::string>()), v.at("producer").get<NodeId>()});
    for (const json& n : doc.at("nodes"))
    {
      const OpKind op = op_from_name(n.at("op").get<std::string>());
      g.add_node_raw(Node{-1, op, n.at("inputs").get<std::vector<ValueId>>(), n.at("outputs").get<std::vector<ValueId>>(),
                          attrs_from_json(op, n.at("attrs")), -1});
    }
    std::vector<FusionGroup> groups;
    for (const json& fg : doc.at("fusion_groups"))
      groups.push_back({-1, fusion_from_name(fg.at("kind").get<std::string>()), fg.at("nodes").get<std::vector<NodeId>>()});
    g.set_fusion_groups(std::move(groups));
    for (const json& o : doc.at("outputs")) g.mark_output(o.get<ValueId>());
  } catch (const json::exception& e) {
    throw GraphError(fmt::format("graph JSON: {}", e.what()));
  } catch (const std::logic_error& e) {  // bad names, ids out of range
    throw GraphError(fmt::format("graph JSON: {}", e.what()));
  }
  verify_graph(g);
  return g;
}

}  // namespace sg
