#include "runtime/plan/schedule.hpp"

#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace sg {
namespace {

bool contains(const std::vector<NodeId>& v, NodeId x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// Values crossing the launch boundary: inputs produced outside, outputs
// read outside (or graph outputs), and in-place targets.
void fill_boundary(const Graph& g, Launch& l) {
  l.reads.clear();
  l.writes.clear();
  l.updates.clear();
  for (NodeId id : l.nodes) {
    const Node& n = g.node(id);
    for (ValueId in : n.inputs) {
      const NodeId producer = g.value(in).producer;
      if ((producer < 0 || !contains(l.nodes, producer)) &&
          std::find(l.reads.begin(), l.reads.end(), in) == l.reads.end())
        l.reads.push_back(in);
    }
    for (ValueId out : n.outputs)
      if (read_outside(g, out, l.nodes) && !std::count(l.carries.begin(), l.carries.end(), out))
        l.writes.push_back(out);
    for (int slot : in_place_inputs(n))
      l.updates.push_back(n.inputs[static_cast<std::size_t>(slot)]);
  }
}

struct CoveredLaunch {
  Launch launch;
  NodeId position = -1;             // the earliest anchor of its units
  std::vector<NodeId> reads_mask_of;
  std::vector<ValueId> unread;
  bool may_ride = false;
};

// Readers must see every value written and no value updated in place (or
// carried to the next step) yet.
std::string order_problem(const Graph& g, const std::vector<Launch>& launches) {
  std::set<ValueId> written, updated, carried;
  std::set<int> masks;
  for (const Value& v : g.values())
    if (is_graph_owned(v.role)) written.insert(v.id);
  for (const Launch& l : launches) written.insert(l.carries.begin(), l.carries.end());  // by the step before
  for (std::size_t i = 0; i < launches.size(); ++i) {
    const Launch& l = launches[i];
    for (ValueId r : l.reads) {
      if (!written.count(r)) return fmt::format("schedule: launch {} reads '{}' before it is written", i, g.value(r).name);
      if (updated.count(r))
        return fmt::format("schedule: launch {} reads '{}' after its in-place update", i, g.value(r).name);
      if (carried.count(r))
        return fmt::format("schedule: launch {} reads '{}' after it was written for the next step", i, g.value(r).name);
    }
    if (l.aux_read >= 0 && !masks.count(l.aux_read))
      return fmt::format("schedule: launch {} reads relu mask {} before it is written", i, l.aux_read);
    for (ValueId w : l.writes) written.insert(w);
    for (ValueId u : l.updates) updated.insert(u);
    carried.insert(l.carries.begin(), l.carries.end());
    if (l.aux_write >= 0) masks.insert(l.aux_write);
  }
  return {};
}

void drop_unread(Launch& l, const std::vector<ValueId>& unread) {
  for (ValueId v : unread) l.reads.erase(std::remove(l.reads.begin(), l.reads.end(), v), l.reads.end());
}

// Launches that may ride on another join the last later one whose lowering
// takes them, where the order stays valid.
void seat_riders(const Graph& g, std::vector<CoveredLaunch>& ls) {
  for (std::size_t r = ls.size(); r-- > 0;) {
    if (!ls[r].may_ride) continue;
    for (std::size_t h = ls.size(); h-- > 0;) {
      if (h == r || !ls[h].launch.lowering->takes_rider(g, ls[h].launch, ls[r].launch)) continue;
      std::vector<Launch> trial;
      for (std::size_t i = 0; i < ls.size(); ++i)
        if (i != r) trial.push_back(ls[i].launch);
      Launch& host = trial[h < r ? h : h - 1];
      host.nodes.insert(host.nodes.end(), ls[r].launch.nodes.begin(), ls[r].launch.nodes.end());
      host.riders.insert(host.riders.end(), ls[r].launch.nodes.begin(), ls[r].launch.nodes.end());
      fill_boundary(g, host);
      drop_unread(host, ls[h].unread);
      if (!order_problem(g, trial).empty()) continue;
      ls[h].launch = host;
      ls.erase(ls.begin() + static_cast<std::ptrdiff_t>(r));
      break;
    }
  }
}

}  // namespace

Cover::Cover(const Graph& graph) : g_(graph), unit_of_node_(graph.nodes().size(), -1) {
  for (const FusionGroup& group : g_.fusion_groups()) {
    CoverUnit u;
    u.id = static_cast<int>(units_.size());
    u.nodes = group.nodes;
    u.fusion_group = group.id;
    u.anchor = group.nodes.front();
    for (NodeId id : group.nodes)
      if (op_updates_in_place(g_.node(id).op)) u.anchor = group.nodes.back();
    for (NodeId id : u.nodes) unit_of_node_[static_cast<std::size_t>(id)] = u.id;
    units_.push_back(std::move(u));
  }
  for (const Node& n : g_.nodes()) {
    if (unit_of_node_[static_cast<std::size_t>(n.id)] >= 0) continue;
    CoverUnit u;
    u.id = static_cast<int>(units_.size());
    u.nodes = {n.id};
    u.anchor = n.id;
    unit_of_node_[static_cast<std::size_t>(n.id)] = u.id;
    units_.push_back(std::move(u));
  }
  taken_.assign(units_.size(), false);
}

const CoverUnit& Cover::unit_of(NodeId node) const {
  return units_.at(static_cast<std::size_t>(unit_of_node_.at(static_cast<std::size_t>(node))));
}

const CoverUnit* Cover::free_group_with(NodeId node, FusionKind kind) const {
  if (node < 0) return nullptr;
  const CoverUnit& u = unit_of(node);
  return !taken(u.id) && is_group(u, kind) ? &u : nullptr;
}

FusionKind Cover::kind_of(const CoverUnit& unit) const {
  return g_.fusion_groups().at(static_cast<std::size_t>(unit.fusion_group)).kind;
}

bool Cover::mask_needed(NodeId relu) const { return std::find(masks_.begin(), masks_.end(), relu) != masks_.end(); }

void Cover::take(const Match& match) {
  for (int u : match.units) {
    if (taken(u)) throw GraphError(fmt::format("schedule: unit {} taken twice", u));
    taken_[static_cast<std::size_t>(u)] = true;
  }
  masks_.insert(masks_.end(), match.reads_mask_of.begin(), match.reads_mask_of.end());
}

bool read_outside(const Graph& g, ValueId v, const std::vector<NodeId>& nodes) {
  if (std::find(g.outputs().begin(), g.outputs().end(), v) != g.outputs().end()) return true;
  for (NodeId reader : g.consumers(v))
    if (!contains(nodes, reader)) return true;
  return false;
}

Schedule build_schedule(const Graph& g, const std::vector<const Lowering*>& lowerings) {
  Cover cover(g);
  std::vector<CoveredLaunch> covered;
  for (const Lowering* lowering : lowerings)
    for (const CoverUnit& unit : cover.units()) {
      if (cover.taken(unit.id)) continue;
      auto m = lowering->match(cover, unit);
      if (!m) continue;
      CoveredLaunch c;
      c.launch.lowering = lowering;
      std::stable_sort(m->units.begin(), m->units.end(), [&](int a, int b) {
        return cover.units()[static_cast<std::size_t>(a)].anchor < cover.units()[static_cast<std::size_t>(b)].anchor;
      });
      for (int u : m->units) {
        const CoverUnit& part = cover.units().at(static_cast<std::size_t>(u));
        c.launch.nodes.insert(c.launch.nodes.end(), part.nodes.begin(), part.nodes.end());
        c.position = c.position < 0       ? part.anchor
                     : m->runs_at_last_unit ? std::max(c.position, part.anchor)
                                            : std::min(c.position, part.anchor);
      }
      if (m->runs_at_unit >= 0) c.position = cover.units().at(static_cast<std::size_t>(m->runs_at_unit)).anchor;
      if (m->graph_order) std::sort(c.launch.nodes.begin(), c.launch.nodes.end());
      c.launch.detail = std::move(m->detail);
      c.launch.scratch = m->scratch;
      c.launch.aliases = m->aliases;
      c.launch.carries = m->carries;
      c.reads_mask_of = m->reads_mask_of;
      c.unread = m->unread;
      c.may_ride = m->may_ride;
      fill_boundary(g, c.launch);
      drop_unread(c.launch, c.unread);
      // The launch runs where its first unit sits (or its last:
      // runs_at_last_unit): everything it reads from outside must be
      // produced before that, or the match is not taken.
      if (std::any_of(c.launch.reads.begin(), c.launch.reads.end(),
                      [&](ValueId v) { return g.value(v).producer >= c.position; }))
        continue;
      cover.take(*m);
      covered.push_back(std::move(c));
    }
  for (const CoverUnit& unit : cover.units())
    if (!cover.taken(unit.id)) {
      const Node& n = g.node(unit.nodes.front());
      throw GraphError(fmt::format("schedule: no lowering takes {} (node {}{})", op_name(n.op), n.id,
                                   unit.fusion_group >= 0 ? fmt::format(", fusion group {}", unit.fusion_group) : ""));
    }
  std::stable_sort(covered.begin(), covered.end(),
                   [](const CoveredLaunch& a, const CoveredLaunch& b) { return a.position < b.position; });
  seat_riders(g, covered);

  // Masks, numbered in the order their readers run; the launch that runs the
  // relu writes it.
  Schedule s;
  std::map<NodeId, int> mask_of_relu;
  for (CoveredLaunch& c : covered)
    for (NodeId relu : c.reads_mask_of) {
      auto [it, fresh] = mask_of_relu.try_emplace(relu, static_cast<int>(s.aux.size()));
      if (fresh) {
        const Value& out = g.value(g.node(relu).outputs[0]);
        s.aux.push_back({out.shape[0], out.shape[1]});
      }
      c.launch.aux_read = it->second;
    }
  for (CoveredLaunch& c : covered) {
    for (NodeId id : c.launch.nodes)
      if (auto it = mask_of_relu.find(id); it != mask_of_relu.end()) c.launch.aux_write = it->second;
    s.launches.push_back(std::move(c.launch));
  }
  check_schedule_order(g, s);
  return s;
}

void check_schedule_order(const Graph& g, const Schedule& s) {
  if (const std::string why = order_problem(g, s.launches); !why.empty()) throw GraphError(why);
}

std::string dump_schedule(const Graph& g, const Schedule& s) {
  std::string out = fmt::format("# {} launches, {} relu masks\n", s.launches.size(), s.aux.size());
  auto names_of = [&](const std::vector<ValueId>& ids) {
    std::vector<std::string> names;
    for (ValueId id : ids) names.push_back(g.value(id).name);
    return fmt::format("{}", fmt::join(names, ","));
  };
  for (std::size_t i = 0; i < s.launches.size(); ++i) {
    const Launch& l = s.launches[i];
    std::vector<std::string> ops;
    for (NodeId n : l.nodes) ops.push_back(fmt::format("n{}:{}", n, op_name(g.node(n).op)));
    std::string what(l.lowering ? l.lowering->name() : "?");
    std::vector<std::string> notes;
    if (l.lowering)
      if (std::string d = l.lowering->describe(g, l); !d.empty()) notes.push_back(std::move(d));
    if (l.aux_write >= 0) notes.push_back(fmt::format("writes mask{}", l.aux_write));
    if (l.aux_read >= 0) notes.push_back(fmt::format("reads mask{}", l.aux_read));
    if (!notes.empty()) what += fmt::format("[{}]", fmt::join(notes, ","));
    for (NodeId r : l.riders) what += fmt::format("[+{}]", op_name(g.node(r).op));
    if (!l.scratch.empty()) what += fmt::format("[scratch {{{}}}]", names_of(l.scratch));
    for (const auto& [out, in] : l.aliases) what += fmt::format("[{} aliases {}]", g.value(out).name, g.value(in).name);
    out += fmt::format("L{} {} ({}) reads {{{}}} writes {{{}}}{}\n", i, what, fmt::join(ops, " "), names_of(l.reads),
                       names_of(l.writes), l.updates.empty() ? "" : fmt::format(" updates {{{}}}", names_of(l.updates)));
    if (!l.carries.empty()) out.insert(out.size() - 1, fmt::format(" carries {{{}}}", names_of(l.carries)));
  }
  return out;
}

}  // namespace sg
