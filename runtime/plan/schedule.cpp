#include "runtime/plan/schedule.hpp"

#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace sg {

std::string_view launch_kind_name(LaunchKind kind) {
  switch (kind) {
    case LaunchKind::batch_fetch: return "batch_fetch";
    case LaunchKind::matmul: return "matmul";
    case LaunchKind::xent: return "xent";
    case LaunchKind::bias_grad_sgd: return "bias_grad_sgd";
    case LaunchKind::single: return "single";
    case LaunchKind::whole_step: return "whole_step";
    case LaunchKind::output_layer_backward: return "output_layer_backward";
    case LaunchKind::dgrad_wgrad_sgd: return "dgrad_wgrad_sgd";
  }
  return "?";
}

std::string_view epilogue_name(MatmulEpilogue e) {
  switch (e) {
    case MatmulEpilogue::none: return "none";
    case MatmulEpilogue::bias: return "bias";
    case MatmulEpilogue::relu_bias: return "relu_bias";
    case MatmulEpilogue::relu_aux_bias: return "relu_aux_bias";
    case MatmulEpilogue::drelu: return "drelu";
  }
  return "?";
}

namespace {

bool contains(const std::vector<NodeId>& v, NodeId x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// Values crossing the launch boundary: inputs produced outside, outputs
// read outside (or graph outputs), and in-place targets.
void fill_boundary(const Graph& g, Launch& l) {
  for (NodeId id : l.nodes) {
    const Node& n = g.node(id);
    for (ValueId in : n.inputs) {
      const NodeId producer = g.value(in).producer;
      if ((producer < 0 || !contains(l.nodes, producer)) &&
          std::find(l.reads.begin(), l.reads.end(), in) == l.reads.end())
        l.reads.push_back(in);
    }
    for (ValueId out : n.outputs) {
      bool external = std::find(g.outputs().begin(), g.outputs().end(), out) != g.outputs().end();
      for (NodeId reader : g.consumers(out)) external = external || !contains(l.nodes, reader);
      if (external) l.writes.push_back(out);
    }
    for (int slot : in_place_inputs(n.op, static_cast<int>(n.inputs.size())))
      l.updates.push_back(n.inputs[static_cast<std::size_t>(slot)]);
  }
}

class Lowering {
 public:
  Lowering(const Graph& g, const ScheduleOptions& options) : g_(g), options_(options) {}

  Schedule run() {
    find_merged_dgrads();
    assign_relu_masks();
    std::set<int> emitted;
    for (const Node& n : g_.nodes()) {
      if (n.fusion_group < 0) {
        emit(lower_single(n));
        continue;
      }
      const FusionGroup& group = g_.fusion_groups()[static_cast<std::size_t>(n.fusion_group)];
      if (n.id == anchor(group) && emitted.insert(group.id).second) emit(lower_group(group));
    }
    merge_dgrad_wgrad_pairs();
    if (options_.merge_bias_into_dgrad_wgrad) merge_bias_updates();
    if (options_.merge_input_update) merge_input_updates();
    if (options_.fold_fetch_into_forward) fold_fetch_into_forward();
    if (options_.fold_step_advance) fold_step_advance();
    if (options_.merge_output_layer_backward) merge_output_layer_backward();
    return std::move(schedule_);
  }

 private:
  // Groups that update a value in place run at their last node (after every
  // read of the old value); the others at their first (before any consumer).
  NodeId anchor(const FusionGroup& group) const {
    for (NodeId id : group.nodes)
      if (op_updates_in_place(g_.node(id).op)) return group.nodes.back();
    return group.nodes.front();
  }

  // The wgrad_sgd group updating the weight a dgrad_drelu group reads with
  // the same output gradient (nullptr if none).
  const FusionGroup* wgrad_partner(const FusionGroup& dgrad) const {
    const Node& mm = g_.node(dgrad.nodes.front());
    for (const FusionGroup& other : g_.fusion_groups()) {
      if (other.kind != FusionKind::wgrad_sgd) continue;
      const Node& wmm = g_.node(other.nodes.front());
      const Node& sgd = g_.node(other.nodes.back());
      if (wmm.inputs[0] == mm.inputs[0] && sgd.inputs[0] == mm.inputs[1] && sgd.inputs.size() == 2) return &other;
    }
    return nullptr;
  }

  // Dgrads the backend runs together with their weight's update: they mask by
  // the ReLU output (which the weight gradient reads anyway), not an aux mask.
  void find_merged_dgrads() {
    if (!options_.merge_dgrad_wgrad) return;
    for (const FusionGroup& group : g_.fusion_groups()) {
      if (group.kind != FusionKind::dgrad_drelu) continue;
      const FusionGroup* partner = wgrad_partner(group);
      if (partner && options_.merge_dgrad_wgrad(g_, group.nodes.front(), partner->nodes.front()))
        merged_dgrads_[group.id] = partner->id;
    }
  }

  // Replaces each adjacent (dgrad, wgrad) launch pair of a merged dgrad by one launch.
  void merge_dgrad_wgrad_pairs() {
    auto& ls = schedule_.launches;
    for (std::size_t i = 0; i + 1 < ls.size(); ++i) {
      const auto partner = merged_dgrads_.find(ls[i].fusion_group);
      if (partner == merged_dgrads_.end()) continue;
      if (ls[i + 1].fusion_group != partner->second)
        throw GraphError(fmt::format("schedule: dgrad launch {} is not followed by its weight's update", i));
      Launch merged;
      merged.kind = LaunchKind::dgrad_wgrad_sgd;
      merged.nodes = ls[i].nodes;
      merged.nodes.insert(merged.nodes.end(), ls[i + 1].nodes.begin(), ls[i + 1].nodes.end());
      merged.matmul_node = ls[i].matmul_node;
      merged.sgd_node = ls[i + 1].sgd_node;
      merged.output = ls[i].output;
      merged.epilogue = MatmulEpilogue::drelu;
      merged.mask_from_relu_output = true;
      fill_boundary(g_, merged);
      ls[i] = std::move(merged);
      ls.erase(ls.begin() + static_cast<std::ptrdiff_t>(i) + 1);
    }
  }

  // Launches i and i + 1 become one: the kept one (the first or the
  // second) with both launches' nodes in their order, the other erased.
  void merge_pair(std::size_t i, bool keep_first) {
    auto& ls = schedule_.launches;
    std::vector<NodeId> nodes = ls[i].nodes;
    nodes.insert(nodes.end(), ls[i + 1].nodes.begin(), ls[i + 1].nodes.end());
    Launch& kept = ls[keep_first ? i : i + 1];
    kept.nodes = std::move(nodes);
    kept.reads.clear();
    kept.writes.clear();
    kept.updates.clear();
    fill_boundary(g_, kept);
    ls.erase(ls.begin() + static_cast<std::ptrdiff_t>(keep_first ? i + 1 : i));
  }

  // A dgrad_wgrad_sgd launch followed by the bias_grad_sgd launch that sums
  // its output (plain SGD) becomes one launch.
  void merge_bias_updates() {
    auto& ls = schedule_.launches;
    for (std::size_t i = 0; i + 1 < ls.size(); ++i) {
      Launch& a = ls[i];
      const Launch& b = ls[i + 1];
      if (a.kind != LaunchKind::dgrad_wgrad_sgd || !plain_bias_update_of(b, a.output) || b.nodes.size() != 2) continue;
      a.bias_sgd_node = b.sgd_node;
      merge_pair(i, /*keep_first=*/true);
    }
  }

  // A dgrad_wgrad_sgd launch followed by the plain-SGD weight update that
  // reads its dX (the first layer's, whose input needs no gradient) becomes
  // one launch.
  void merge_input_updates() {
    auto& ls = schedule_.launches;
    for (std::size_t i = 0; i + 1 < ls.size(); ++i) {
      Launch& a = ls[i];
      const Launch& b = ls[i + 1];
      if (a.kind != LaunchKind::dgrad_wgrad_sgd || b.kind != LaunchKind::matmul ||
          b.target != MatmulTarget::param_sgd || g_.node(b.matmul_node).inputs[0] != a.output ||
          g_.node(b.sgd_node).inputs.size() != 2 || b.nodes.size() != 2)
        continue;
      if (!options_.merge_input_update(g_, a.matmul_node, b.matmul_node)) continue;
      a.input_wgrad_node = b.matmul_node;
      a.input_sgd_node = b.sgd_node;
      merge_pair(i, /*keep_first=*/true);
    }
  }

  // The batch fetch launch and the forward matmul launch right after it
  // that reads the fetched images become one launch.
  void fold_fetch_into_forward() {
    auto& ls = schedule_.launches;
    for (std::size_t i = 0; i + 1 < ls.size(); ++i) {
      if (ls[i].kind != LaunchKind::batch_fetch) continue;
      Launch& fwd = ls[i + 1];
      if (fwd.kind != LaunchKind::matmul || fwd.target != MatmulTarget::output || fwd.fetches_batch) continue;
      const ValueId x = g_.node(fwd.matmul_node).inputs[0];
      if (std::find(ls[i].writes.begin(), ls[i].writes.end(), x) == ls[i].writes.end()) continue;
      if (!options_.fold_fetch_into_forward(g_, fwd.matmul_node)) continue;
      fwd.fetches_batch = true;
      merge_pair(i, /*keep_first=*/false);
    }
  }

  // Moves a trailing lone advance_step onto the last bias_grad_sgd launch.
  void fold_step_advance() {
    auto& ls = schedule_.launches;
    if (ls.empty() || ls.back().kind != LaunchKind::single || g_.node(ls.back().nodes[0]).op != OpKind::advance_step)
      return;
    for (std::size_t i = ls.size() - 1; i-- > 0;) {
      if (ls[i].kind != LaunchKind::bias_grad_sgd) continue;
      ls[i].advance_node = ls.back().nodes[0];
      ls[i].nodes.push_back(ls[i].advance_node);
      ls[i].updates.push_back(g_.node(ls[i].advance_node).inputs[0]);
      ls.pop_back();
      return;
    }
  }

  // The launch among ls[from, to) that `matches`, if exactly one does.
  template <typename Match>
  std::ptrdiff_t only(const std::vector<Launch>& ls, std::size_t from, std::size_t to, Match matches) const {
    std::ptrdiff_t found = -1;
    for (std::size_t i = from; i < to; ++i)
      if (matches(ls[i])) {
        if (found >= 0) return -1;
        found = static_cast<std::ptrdiff_t>(i);
      }
    return found;
  }

  // A plain-SGD bias_grad_sgd launch summing `grad`.
  bool plain_bias_update_of(const Launch& l, ValueId grad) const {
    return l.kind == LaunchKind::bias_grad_sgd && g_.node(l.nodes.front()).inputs[0] == grad &&
           g_.node(l.sgd_node).inputs.size() == 2;
  }

  // The xent launch and the four launches right after it that only serve the
  // output layer become one output_layer_backward launch.
  void merge_output_layer_backward() {
    auto& ls = schedule_.launches;
    for (std::size_t i = 0; i + 4 < ls.size(); ++i) {
      if (ls[i].kind != LaunchKind::xent || ls[i].nodes.size() != 2) continue;
      const NodeId xent_bw = ls[i].nodes[1];
      const ValueId dlogits = g_.node(xent_bw).outputs[0];
      const std::size_t end = i + 5;
      const auto out_bias = only(ls, i + 1, end, [&](const Launch& l) { return plain_bias_update_of(l, dlogits); });
      const auto dgrad = only(ls, i + 1, end, [&](const Launch& l) {
        return l.kind == LaunchKind::matmul && l.epilogue == MatmulEpilogue::drelu && l.mask_from_relu_output &&
               g_.node(l.matmul_node).inputs[0] == dlogits;
      });
      const auto weight = only(ls, i + 1, end, [&](const Launch& l) {
        return l.kind == LaunchKind::matmul && l.target == MatmulTarget::param_sgd &&
               g_.node(l.matmul_node).inputs[0] == dlogits && g_.node(l.sgd_node).inputs.size() == 2;
      });
      if (out_bias < 0 || dgrad < 0 || weight < 0) continue;
      const auto hidden_bias =
          only(ls, i + 1, end, [&](const Launch& l) { return plain_bias_update_of(l, ls[std::size_t(dgrad)].output); });
      if (hidden_bias < 0) continue;
      const Launch& dg = ls[std::size_t(dgrad)];
      // the dgrad's weight is the one the fused SGD updates
      if (g_.node(dg.matmul_node).inputs[1] != g_.node(ls[std::size_t(weight)].sgd_node).inputs[0]) continue;
      if (ls[std::size_t(out_bias)].advance_node >= 0) continue;  // the advance rides on the last bias update only
      if (!options_.merge_output_layer_backward(g_, xent_bw, dg.matmul_node)) continue;
      Launch merged;
      merged.kind = LaunchKind::output_layer_backward;
      merged.nodes = ls[i].nodes;
      for (std::size_t k = i + 1; k < end; ++k) merged.nodes.insert(merged.nodes.end(), ls[k].nodes.begin(), ls[k].nodes.end());
      merged.matmul_node = dg.matmul_node;
      merged.output = dg.output;
      merged.mask_from_relu_output = true;
      merged.sgd_node = ls[std::size_t(weight)].sgd_node;
      merged.output_bias_sgd_node = ls[std::size_t(out_bias)].sgd_node;
      merged.bias_sgd_node = ls[std::size_t(hidden_bias)].sgd_node;
      merged.advance_node = ls[std::size_t(hidden_bias)].advance_node;
      fill_boundary(g_, merged);
      ls[i] = std::move(merged);
      ls.erase(ls.begin() + static_cast<std::ptrdiff_t>(i) + 1, ls.begin() + static_cast<std::ptrdiff_t>(end));
    }
  }

  // A dgrad_drelu group whose matmul sums over at most kSmallInnerDim terms.
  bool small_inner_dgrad(const FusionGroup& group) const {
    const Node& mm = g_.node(group.nodes.front());
    const Value& a = g_.value(mm.inputs[0]);
    return (mm.attrs.trans_a ? a.shape[0] : a.shape[1]) <= kSmallInnerDim;
  }

  // A relu fused into a forward matmul keeps its mask for the fused backward
  // (unless that backward masks by the relu output instead).
  void assign_relu_masks() {
    for (const FusionGroup& group : g_.fusion_groups()) {
      if (group.kind != FusionKind::dgrad_drelu || small_inner_dgrad(group) || merged_dgrads_.count(group.id)) continue;
      const Node& relu_bw = g_.node(group.nodes.back());
      const NodeId relu = g_.value(relu_bw.inputs[1]).producer;
      if (!mask_of_relu_.count(relu)) {
        const Value& out = g_.value(g_.node(relu).outputs[0]);
        mask_of_relu_[relu] = static_cast<int>(schedule_.aux.size());
        schedule_.aux.push_back({out.shape[0], out.shape[1]});
      }
    }
  }

  void emit(Launch launch) { schedule_.launches.push_back(std::move(launch)); }

  Launch lower_single(const Node& n) const {
    if (n.op == OpKind::batch_indices || n.op == OpKind::gather_rows)
      throw GraphError(fmt::format("schedule: {} (node {}) must be fused into a batch_fetch group", op_name(n.op), n.id));
    Launch l;
    l.nodes = {n.id};
    if (n.op == OpKind::matmul) {
      l.kind = LaunchKind::matmul;
      l.matmul_node = n.id;
      l.output = n.outputs[0];
    } else {
      l.kind = LaunchKind::single;
    }
    fill_boundary(g_, l);
    return l;
  }

  Launch lower_group(const FusionGroup& group) const {
    Launch l;
    l.nodes = group.nodes;
    l.fusion_group = group.id;
    const Node& first = g_.node(group.nodes.front());
    const Node& last = g_.node(group.nodes.back());
    switch (group.kind) {
      case FusionKind::batch_fetch:
        l.kind = LaunchKind::batch_fetch;
        break;
      case FusionKind::xent_fused:
        l.kind = LaunchKind::xent;
        break;
      case FusionKind::linear_forward: {
        l.kind = LaunchKind::matmul;
        l.matmul_node = first.id;
        l.bias = g_.node(group.nodes[1]).inputs[1];
        l.output = last.outputs[0];
        if (last.op == OpKind::relu) {
          auto mask = mask_of_relu_.find(last.id);
          l.epilogue = mask == mask_of_relu_.end() ? MatmulEpilogue::relu_bias : MatmulEpilogue::relu_aux_bias;
          if (mask != mask_of_relu_.end()) l.aux_write = mask->second;
        } else {
          l.epilogue = MatmulEpilogue::bias;
        }
        break;
      }
      case FusionKind::dgrad_drelu:
        l.kind = LaunchKind::matmul;
        l.matmul_node = first.id;
        l.epilogue = MatmulEpilogue::drelu;
        l.output = last.outputs[0];
        l.mask_from_relu_output = small_inner_dgrad(group) || merged_dgrads_.count(group.id);
        if (!l.mask_from_relu_output) l.aux_read = mask_of_relu_.at(g_.value(last.inputs[1]).producer);
        break;
      case FusionKind::wgrad_sgd:
        l.kind = LaunchKind::matmul;
        l.matmul_node = first.id;
        l.sgd_node = last.id;
        l.target = last.inputs.size() == 3 ? MatmulTarget::velocity_sgd : MatmulTarget::param_sgd;
        break;
      case FusionKind::bgrad_sgd:
        l.kind = LaunchKind::bias_grad_sgd;
        l.sgd_node = last.id;
        break;
    }
    fill_boundary(g_, l);
    if (group.kind == FusionKind::dgrad_drelu && !l.mask_from_relu_output) {
      // The mask replaces the relu output: the kernel never reads that value.
      const ValueId relu_out = last.inputs[1];
      l.reads.erase(std::remove(l.reads.begin(), l.reads.end(), relu_out), l.reads.end());
    }
    return l;
  }

  const Graph& g_;
  const ScheduleOptions& options_;
  Schedule schedule_;
  std::map<NodeId, int> mask_of_relu_;
  std::map<int, int> merged_dgrads_;  // dgrad_drelu group id -> its weight's wgrad_sgd group id
};

}  // namespace

Schedule build_schedule(const Graph& graph, const ScheduleOptions& options) {
  Schedule s = Lowering(graph, options).run();
  check_schedule_order(graph, s);
  return s;
}

Schedule build_whole_step_schedule(const Graph& graph, const WholeStepPlan& plan) {
  Launch l;
  l.kind = LaunchKind::whole_step;
  for (const Node& n : graph.nodes()) l.nodes.push_back(n.id);
  fill_boundary(graph, l);
  for (const WholeStepLayer& layer : plan.layers)  // hidden layers; the logits stay on chip
    if (layer.pre_activation_grad >= 0) {
      l.scratch.push_back(layer.output);
      l.scratch.push_back(layer.pre_activation_grad);
    }
  l.whole_step = std::make_shared<const WholeStepPlan>(plan);
  Schedule s;
  s.launches.push_back(std::move(l));
  check_schedule_order(graph, s);
  return s;
}

void check_schedule_order(const Graph& g, const Schedule& s) {
  std::set<ValueId> written, updated;
  std::set<int> masks;
  for (const Value& v : g.values())
    if (is_graph_owned(v.role)) written.insert(v.id);
  for (std::size_t i = 0; i < s.launches.size(); ++i) {
    const Launch& l = s.launches[i];
    for (ValueId r : l.reads) {
      if (!written.count(r))
        throw GraphError(fmt::format("schedule: launch {} reads '{}' before it is written", i, g.value(r).name));
      if (updated.count(r))
        throw GraphError(fmt::format("schedule: launch {} reads '{}' after its in-place update", i, g.value(r).name));
    }
    if (l.aux_read >= 0 && !masks.count(l.aux_read))
      throw GraphError(fmt::format("schedule: launch {} reads relu mask {} before it is written", i, l.aux_read));
    for (ValueId w : l.writes) written.insert(w);
    for (ValueId u : l.updates) updated.insert(u);
    if (l.aux_write >= 0) masks.insert(l.aux_write);
  }
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
    std::string what(launch_kind_name(l.kind));
    if (l.kind == LaunchKind::matmul) {
      what += fmt::format("[epilogue={}", epilogue_name(l.epilogue));
      if (l.target == MatmulTarget::param_sgd) what += ",into=param(alpha=-lr,beta=1-lr*wd)";
      if (l.target == MatmulTarget::velocity_sgd) what += ",into=velocity(alpha=1,beta=momentum)+momentum_finish";
      if (l.aux_write >= 0) what += fmt::format(",writes mask{}", l.aux_write);
      if (l.aux_read >= 0) what += fmt::format(",reads mask{}", l.aux_read);
      if (l.mask_from_relu_output) what += ",mask=relu output";
      if (l.fetches_batch) what += ",+batch fetch";
      what += "]";
    }
    if (l.kind == LaunchKind::dgrad_wgrad_sgd)
      what += fmt::format("[mask=relu output,into=param(alpha=-lr,beta=1-lr*wd){}{}]",
                          l.bias_sgd_node >= 0 ? ",+bias update" : "",
                          l.input_sgd_node >= 0 ? ",+first layer's weight update" : "");
    if (l.kind == LaunchKind::output_layer_backward) what += "[mask=relu output,+bias updates]";
    if (l.advance_node >= 0) what += "[+advance_step]";
    if (l.kind == LaunchKind::whole_step)
      what += fmt::format("[dims={},batch={},scratch {{{}}}]", fmt::join(l.whole_step->dims, "-"), l.whole_step->batch,
                          names_of(l.scratch));
    out += fmt::format("L{} {} ({}) reads {{{}}} writes {{{}}}{}\n", i, what, fmt::join(ops, " "), names_of(l.reads),
                       names_of(l.writes), l.updates.empty() ? "" : fmt::format(" updates {{{}}}", names_of(l.updates)));
  }
  return out;
}

}  // namespace sg
