#include "graph/channels_last_pass.hpp"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

namespace sg {
namespace {

// Ops whose output is element i of a function of element i of each input
// (no position, channel or step dependence): they run in either layout.
// dropout is not one of them: its mask is keyed on the element's index.
bool layout_free(OpKind op) {
  switch (op) {
    case OpKind::relu:
    case OpKind::gelu:
    case OpKind::gelu_tanh:
    case OpKind::silu:
    case OpKind::tanh:
    case OpKind::sigmoid:
    case OpKind::cast:
    case OpKind::add:
      return true;
    default:
      return false;
  }
}

// The batch_norm ops a forward or eval graph holds (their backward comes from autodiff).
bool is_batch_norm(OpKind op) {
  return op == OpKind::batch_norm || op == OpKind::batch_norm_stats_update || op == OpKind::batch_norm_inference;
}

// Readers of a channels-last value that take it back channels-first at the
// network's end of the region: a flatten (a view at 1x1) or the global
// average pooling (its input is the last stage's small map).
bool region_end(OpKind op) {
  return op == OpKind::flatten || op == OpKind::reshape || op == OpKind::global_avg_pool2d;
}

class Rewriter {
 public:
  explicit Rewriter(const Graph& from) : from_(from) {}

  std::optional<ChannelsLastRewrite> run() {
    for (const Value& v : from_.values())
      if (v.producer < 0) first_[v.id] = owned(v);
    for (const Node& n : from_.nodes()) rewrite(n);
    for (ValueId out : from_.outputs()) out_.graph.mark_output(channels_first(out));
    if (out_.convolutions == 0) return std::nullopt;
    // An exit costs more than the flatten's own conversion only when a region
    // starts again after it (a transpose each way); a dropout between the
    // last pooling and the flatten converts once, as the flatten would.
    out_.inner_exits = reentered_ ? static_cast<int>(inner_exits_.size()) : 0;
    return std::move(out_);
  }

 private:
  ValueId owned(const Value& v) {
    Graph& g = out_.graph;
    switch (v.role) {
      case Role::input:
        return g.input(v.name, v.shape, v.dtype);
      case Role::label:
        return g.label(v.name, v.shape, v.dtype);
      case Role::param:
        return g.param(v.name, v.shape, v.dtype);
      default:
        return g.state(v.name, v.shape, v.dtype);
    }
  }

  static bool is_view(const Shape& nchw) { return layout_conversion_is_view(nchw[1], nchw[2] * nchw[3]); }

  ValueId channels_first(ValueId old) {
    if (auto it = first_.find(old); it != first_.end()) return it->second;
    const ValueId last = last_.at(old);
    const Value& v = from_.value(old);
    const ValueId converted =
        out_.graph.append_node(OpKind::to_channels_first, {last}, NoAttrs{}, Role::activation, v.name + "_nchw").front();
    if (!is_view(v.shape)) ++out_.copies;
    return first_[old] = converted;
  }

  ValueId channels_last(ValueId old) {
    if (auto it = last_.find(old); it != last_.end()) return it->second;
    reentered_ = reentered_ || !inner_exits_.empty();
    const Value& v = from_.value(old);
    const ValueId converted =
        out_.graph
            .append_node(OpKind::to_channels_last, {channels_first(old)}, NoAttrs{}, Role::activation, v.name + "_nhwc")
            .front();
    if (!is_view(v.shape)) ++out_.copies;
    return last_[old] = converted;
  }

  // Whether the rewritten producer writes the value channels-last.
  bool is_last(ValueId old) const { return produced_last_.count(old) > 0; }
  bool is_4d(ValueId old) const { return from_.value(old).shape.size() == 4; }

  void rewrite(const Node& n) {
    std::vector<ValueId> inputs;
    OpAttrs attrs = n.attrs;
    bool last = false;
    if (n.op == OpKind::conv2d && is_4d(n.inputs[0])) {
      auto a = n.attr<Conv2dAttrs>();
      a.channels_last = last = true;
      attrs = a;
      inputs.push_back(channels_last(n.inputs[0]));
      for (std::size_t i = 1; i < n.inputs.size(); ++i) inputs.push_back(channels_first(n.inputs[i]));
      ++out_.convolutions;
    } else if ((n.op == OpKind::max_pool2d || n.op == OpKind::avg_pool2d) && is_last(n.inputs[0])) {
      auto a = n.attr<Pool2dAttrs>();
      a.channels_last = last = true;
      attrs = a;
      inputs.push_back(last_.at(n.inputs[0]));
    } else if (n.op == OpKind::dropout2d && is_last(n.inputs[0])) {
      // The keep bit is drawn per (example, channel), in either layout.
      auto a = n.attr<DropoutAttrs>();
      a.channels_last = last = true;
      attrs = a;
      inputs = {last_.at(n.inputs[0]), channels_first(n.inputs[1])};
    } else if (is_batch_norm(n.op) && is_last(n.inputs[0])) {
      // [N,H,W,C] is BatchNorm1d's [N*H*W, C]: the same statistics, its
      // per-channel values unchanged. stats_update writes no activation.
      auto a = n.attr<BatchNormAttrs>();
      a.channels_last = last = true;
      attrs = a;
      inputs.push_back(last_.at(n.inputs[0]));
      for (std::size_t i = 1; i < n.inputs.size(); ++i) inputs.push_back(channels_first(n.inputs[i]));
      out_.batch_norms += n.op == OpKind::batch_norm;
    } else if (layout_free(n.op) &&
               std::all_of(n.inputs.begin(), n.inputs.end(), [&](ValueId v) { return is_last(v); })) {
      last = true;
      for (ValueId v : n.inputs) inputs.push_back(last_.at(v));
    } else {
      for (ValueId v : n.inputs) {
        if (!region_end(n.op) && is_last(v) && !is_view(from_.value(v).shape)) inner_exits_.insert(v);
        inputs.push_back(channels_first(v));
      }
    }
    const Role role = n.outputs.empty() ? Role::activation : from_.value(n.outputs[0]).role;
    const std::string name = n.outputs.empty() ? std::string() : from_.value(n.outputs[0]).name;
    const auto outs = out_.graph.append_node(n.op, std::move(inputs), attrs, role, name);
    for (std::size_t i = 0; i < outs.size(); ++i) {
      (last ? last_ : first_)[n.outputs[i]] = outs[i];
      if (last) produced_last_.insert(n.outputs[i]);
    }
  }

  const Graph& from_;
  ChannelsLastRewrite out_;
  // The rewritten value of each original one, channels-first and channels-last.
  std::unordered_map<ValueId, ValueId> first_, last_;
  std::unordered_set<ValueId> produced_last_;
  std::unordered_set<ValueId> inner_exits_;  // converted back for a reader other than a flatten
  bool reentered_ = false;                   // a value converted to channels-last after such an exit
};

}  // namespace

std::optional<ChannelsLastRewrite> rewrite_channels_last(const Graph& forward) { return Rewriter(forward).run(); }

}  // namespace sg
