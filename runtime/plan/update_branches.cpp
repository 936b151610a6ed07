#include "runtime/plan/update_branches.hpp"

#include <algorithm>
#include <cstddef>

#include "graph/optimizer_pass.hpp"

namespace sg {
namespace {

// The cheap steps between a parameter's gradient and its update rule: only
// these pass "feeds only the updates" on to what they read. Were a matmul or
// a convolution's gradient among them, the whole backward pass would qualify
// (every data gradient ends in some weight's update) and leave no chain.
bool is_gradient_plumbing(OpKind op) {
  switch (op) {
    case OpKind::cast:
    case OpKind::reduce_rows:
    case OpKind::channel_sum:
    case OpKind::reshape:
    case OpKind::flatten:
    case OpKind::add:
    case OpKind::scale_grad:
    case OpKind::grad_clip_scale:
    case OpKind::all_reduce_mean:
    // A channels-last weight gradient's way back to its parameter's layout
    // (graph/filter_layout_pass.hpp); missing here, it kept the weight
    // gradients written [O,KH,KW,C] off the gradient stream.
    case OpKind::to_channels_first:
      return true;
    default:
      return false;
  }
}

}  // namespace

std::vector<bool> feeds_only_updates(const Graph& g) {
  std::vector<std::vector<NodeId>> readers(g.values().size());
  for (const Node& n : g.nodes())
    for (ValueId in : n.inputs) {
      auto& r = readers[static_cast<std::size_t>(in)];
      if (std::find(r.begin(), r.end(), n.id) == r.end()) r.push_back(n.id);
    }
  std::vector<bool> feeds(g.values().size(), false);
  // Readers come after their producer in the graph's order: walking it
  // backwards settles every reader's outputs before their inputs.
  for (auto n = g.nodes().rbegin(); n != g.nodes().rend(); ++n)
    for (ValueId out : n->outputs) {
      const auto& r = readers[static_cast<std::size_t>(out)];
      feeds[static_cast<std::size_t>(out)] = !r.empty() && std::all_of(r.begin(), r.end(), [&](NodeId reader) {
        const Node& m = g.node(reader);
        if (is_update_rule(m.op)) return true;
        return is_gradient_plumbing(m.op) && std::all_of(m.outputs.begin(), m.outputs.end(),
                                                         [&](ValueId o) { return feeds[static_cast<std::size_t>(o)]; });
      });
    }
  return feeds;
}

std::vector<bool> update_branch_launches(const Graph& g, const Schedule& s) {
  const std::vector<bool> feeds = feeds_only_updates(g);
  std::vector<bool> branch;
  for (const Launch& l : s.launches) {
    const bool uses_mask = l.aux_read >= 0 || l.aux_write >= 0;
    const bool does_something = !l.writes.empty() || !l.updates.empty();
    const bool only_updates =
        std::all_of(l.writes.begin(), l.writes.end(), [&](ValueId v) { return feeds[static_cast<std::size_t>(v)]; });
    branch.push_back(!uses_mask && does_something && only_updates);
  }
  return branch;
}

}  // namespace sg
