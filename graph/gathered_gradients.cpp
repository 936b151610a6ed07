#include "graph/gathered_gradients.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

namespace sg {
namespace {

bool view_or_layout(OpKind op) {
  return op == OpKind::reshape || op == OpKind::flatten || op == OpKind::to_channels_last ||
         op == OpKind::to_channels_first;
}

// A value with one row per example of this rank's batch: computed from the
// batch (an activation, a gradient) or fed with it, not a parameter or state.
// Not a view or layout copy of another value (a flatten, a channels-last
// input): lowerings fold those into their neighbours' launches, where a
// gather in between would read it before it is written.
bool batch_major(const Graph& g, const Value& v) {
  if (v.producer >= 0 && view_or_layout(g.node(v.producer).op)) return false;
  return (v.role == Role::input || v.role == Role::activation || v.role == Role::grad) && !v.shape.empty() &&
         v.shape[0] > 0;
}

// The inputs whose rows node `n` sums over (its output is a sum over the
// batch of per-example terms), or nothing when it is not such a node.
std::optional<std::vector<ValueId>> rows_summed(const Graph& g, const Node& n) {
  std::vector<ValueId> in;
  switch (n.op) {
    case OpKind::matmul: {
      const auto& a = n.attr<MatmulAttrs>();
      if (!a.trans_a || a.trans_b) return std::nullopt;  // A^T B contracts both inputs' first dimension
      in = {n.inputs[0], n.inputs[1]};
      break;
    }
    case OpKind::reduce_rows:
    case OpKind::channel_sum:
      in = {n.inputs[0]};
      break;
    case OpKind::conv2d_backward_filter:
      in = {n.inputs[0], n.inputs[1]};
      break;
    default:
      return std::nullopt;
  }
  const std::int64_t rows = g.value(in.front()).shape.empty() ? 0 : g.value(in.front()).shape[0];
  for (ValueId v : in)
    if (!batch_major(g, g.value(v)) || g.value(v).shape[0] != rows) return std::nullopt;
  return in;
}

struct Layer {
  std::vector<ValueId> params, computed;  // `computed`: each gradient's producing node's output
  std::vector<ValueId> rows;              // the values they read, each once
  bool qualifies = true;
  LayerTraffic traffic;
};

}  // namespace

std::string_view weight_gradients_name(WeightGradients mode) {
  switch (mode) {
    case WeightGradients::reduce: return "reduce";
    case WeightGradients::gather: return "gather";
    case WeightGradients::by_bytes: return "auto";
  }
  return "?";
}

WeightGradients weight_gradients_from_name(std::string_view name) {
  for (WeightGradients m : {WeightGradients::reduce, WeightGradients::gather, WeightGradients::by_bytes})
    if (weight_gradients_name(m) == name) return m;
  throw std::invalid_argument(fmt::format("unknown weight_gradients '{}' (reduce, gather, auto)", name));
}

bool gathering_pays(const LayerTraffic& t) { return t.gathered + t.gathers * kCollectiveCallBytes < t.reduced; }

NodeId gradient_producer(const Graph& g, ValueId grad) {
  NodeId n = g.value(grad).producer;
  while (n >= 0 && (g.node(n).op == OpKind::cast || g.node(n).op == OpKind::to_channels_first) &&
         g.value(g.node(n).inputs[0]).producer >= 0)
    n = g.value(g.node(n).inputs[0]).producer;
  return n;
}

ValueId gradient_layer(const Graph& g, ValueId grad) {
  const NodeId n = gradient_producer(g, grad);
  if (n < 0) return grad;
  for (ValueId in : g.node(n).inputs) {
    if (g.value(in).role != Role::grad) continue;
    // A channels-last bias gradient sums a [N*H*W, C] view of the dY its filter gradient reads.
    for (NodeId p = g.value(in).producer; p >= 0 && view_or_layout(g.node(p).op) &&
                                          g.value(g.node(p).inputs[0]).role == Role::grad;
         p = g.value(in).producer)
      in = g.node(p).inputs[0];
    return in;
  }
  return grad;
}

std::set<ValueId> gather_rows_for_gradients(Graph& g, const GradientMap& grads, std::int64_t ranks,
                                            WeightGradients mode) {
  std::set<ValueId> gathered_params;
  if (ranks < 2 || mode == WeightGradients::reduce) return gathered_params;
  std::map<ValueId, Layer> layers;  // by gradient_layer
  for (const auto& [param, grad] : grads.of_param) {
    Layer& layer = layers[gradient_layer(g, grad)];
    layer.params.push_back(param);
    layer.traffic.reduced += static_cast<std::int64_t>(value_bytes(g.value(grad))) * 2 * (ranks - 1) / ranks;
    const NodeId producer = gradient_producer(g, grad);
    const auto rows = producer >= 0 ? rows_summed(g, g.node(producer)) : std::nullopt;
    if (!rows) {
      layer.qualifies = false;
      continue;
    }
    layer.computed.push_back(g.node(producer).outputs[0]);
    for (ValueId v : *rows)
      if (std::find(layer.rows.begin(), layer.rows.end(), v) == layer.rows.end()) {
        layer.rows.push_back(v);
        layer.traffic.gathered += static_cast<std::int64_t>(value_bytes(g.value(v))) * (ranks - 1);
        ++layer.traffic.gathers;
      }
  }
  std::map<ValueId, ValueId> gathered;  // a value -> its all_gather_batch output
  std::vector<ValueId> rewired;         // the gradient nodes' outputs to read the gathered values
  for (const auto& [key, layer] : layers) {
    if (!layer.qualifies) continue;
    if (mode == WeightGradients::by_bytes && !gathering_pays(layer.traffic)) continue;
    for (ValueId v : layer.rows) {
      if (gathered.count(v)) continue;
      const NodeId producer = g.value(v).producer;
      const std::size_t at = producer >= 0 ? static_cast<std::size_t>(producer) + 1 : 0;
      gathered[v] = g.insert_node(at, OpKind::all_gather_batch, {v}, AllReduceAttrs{false, ranks},
                                  g.value(v).role == Role::grad ? Role::grad : Role::activation,
                                  "all_rows_" + g.value(v).name)
                        .front();
    }
    rewired.insert(rewired.end(), layer.computed.begin(), layer.computed.end());
    gathered_params.insert(layer.params.begin(), layer.params.end());
  }
  for (ValueId out : rewired) {  // node ids moved with the insertions: found again from their outputs
    const Node& n = g.node(g.value(out).producer);
    std::vector<ValueId> inputs = n.inputs;
    for (ValueId& v : inputs)
      if (auto it = gathered.find(v); it != gathered.end()) v = it->second;
    g.rewire(n.id, inputs, n.attrs);  // the same output: a sum over more rows
  }
  return gathered_params;
}

}  // namespace sg
