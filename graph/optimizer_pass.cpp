#include "graph/optimizer_pass.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace sg {
namespace {

// First position after every node that produces one of `inputs` or reads `param`.
std::size_t earliest_update_position(const Graph& g, ValueId param, const std::vector<ValueId>& inputs) {
  std::size_t pos = 0;
  for (ValueId v : inputs)
    if (g.value(v).producer >= 0) pos = std::max(pos, static_cast<std::size_t>(g.value(v).producer) + 1);
  for (NodeId reader : g.consumers(param)) pos = std::max(pos, static_cast<std::size_t>(reader) + 1);
  return pos;
}

std::size_t after_last_gradient(const Graph& g, const GradientMap& grads) {
  std::size_t pos = 0;
  for (const auto& [param, grad] : grads.of_param)
    pos = std::max(pos, static_cast<std::size_t>(g.value(grad).producer) + 1);
  return pos;
}

// The clip scale over every gradient, right after the last of them is produced.
ValueId append_clip_scale(Graph& g, const GradientMap& grads, double max_norm) {
  std::vector<ValueId> all;
  for (const auto& [param, grad] : grads.of_param) all.push_back(grad);
  return g.insert_node(after_last_gradient(g, grads), OpKind::grad_clip_scale, all, ClipGradAttrs{max_norm},
                       Role::grad, "grad_clip_scale")
      .front();
}

// The f16/bf16 gradient that `grad` (f32) widens, when a cast read by nothing
// yet makes grad from a value that only it reads (fp32 master weights: the
// compute dtype's gradient cast for the update); else nothing.
std::optional<ValueId> narrow_gradient(const Graph& g, ValueId grad) {
  const Value& wide = g.value(grad);
  if (wide.producer < 0 || wide.dtype != DType::f32 || !g.consumers(grad).empty()) return std::nullopt;
  const Node& cast = g.node(wide.producer);
  if (cast.op != OpKind::cast) return std::nullopt;
  const ValueId narrow = cast.inputs[0];
  const DType d = g.value(narrow).dtype;
  if ((d != DType::f16 && d != DType::bf16) || g.consumers(narrow).size() != 1) return std::nullopt;
  if (std::find(g.outputs().begin(), g.outputs().end(), narrow) != g.outputs().end()) return std::nullopt;
  return narrow;
}

// A bucket: the gradients one all_reduce_mean reduces (in[i], the
// parameter's gradient or the f16/bf16 value its cast widens: widened[i] is
// then that cast's f32 output, else -1) and their bytes.
struct Bucket {
  std::vector<ValueId> params, in, widened;
  std::int64_t bytes = 0;
};

// The position right after a bucket's last gradient.
std::size_t after_last(const Graph& g, const Bucket& b) {
  std::size_t pos = 0;
  for (ValueId v : b.in) pos = std::max(pos, static_cast<std::size_t>(g.value(v).producer) + 1);
  return pos;
}

// The buckets: one per layer, or with `bucket_bytes` > 0 the layers' buckets
// joined in the order their gradients complete (the backward pass's order)
// until one holds at least bucket_bytes.
std::vector<Bucket> buckets_of(const Graph& g, const GradientMap& grads, bool compute_dtype,
                               std::int64_t bucket_bytes) {
  std::map<ValueId, std::vector<ValueId>> layers;  // layer key -> its parameters
  for (const auto& [param, grad] : grads.of_param) layers[gradient_layer(g, grad)].push_back(param);
  std::vector<Bucket> per_layer;
  for (const auto& [key, params] : layers) {
    Bucket b;
    for (ValueId p : params) {
      const ValueId grad = grads.of_param.at(p);
      const auto narrow = compute_dtype ? narrow_gradient(g, grad) : std::nullopt;
      const ValueId in = narrow ? *narrow : grad;
      b.params.push_back(p);
      b.in.push_back(in);
      b.widened.push_back(narrow ? grad : -1);
      b.bytes += static_cast<std::int64_t>(value_bytes(g.value(in)));
    }
    per_layer.push_back(std::move(b));
  }
  if (bucket_bytes <= 0) return per_layer;
  std::stable_sort(per_layer.begin(), per_layer.end(),
                   [&](const Bucket& a, const Bucket& b) { return after_last(g, a) < after_last(g, b); });
  std::vector<Bucket> joined;
  for (Bucket& layer : per_layer) {
    if (joined.empty() || joined.back().bytes >= bucket_bytes) joined.emplace_back();
    Bucket& b = joined.back();
    b.params.insert(b.params.end(), layer.params.begin(), layer.params.end());
    b.in.insert(b.in.end(), layer.in.begin(), layer.in.end());
    b.widened.insert(b.widened.end(), layer.widened.begin(), layer.widened.end());
    b.bytes += layer.bytes;
  }
  return joined;
}

// One all_reduce_mean per bucket (buckets_of), each right after the last
// gradient of its bucket; returns the map with the reduced gradients. With
// `compute_dtype`, a gradient widened for an fp32 master weight is reduced
// before its cast (half the bytes), and the cast moves to the end of the
// backward pass: the first reader of a bucket's means then comes after every
// bucket, so each all-reduce still overlaps the earlier layers' backward.
// Scales every loss backward's gradient by 1 / ranks (OptimizerSpec::pre_scale_ranks).
void pre_scale_loss_gradients(Graph& g, std::int64_t ranks) {
  const double scale = 1.0 / static_cast<double>(ranks);
  std::size_t scaled = 0;
  for (const Node& n : g.nodes()) {
    if (n.op == OpKind::softmax_xent_backward || n.op == OpKind::mse_loss_backward ||
        n.op == OpKind::l1_loss_backward) {
      g.set_attrs(n.id, LossGradientAttrs{scale});
      ++scaled;
    } else if (n.op == OpKind::softmax_xent_smoothed_backward) {
      LabelSmoothingAttrs attrs = n.attr<LabelSmoothingAttrs>();
      attrs.gradient_scale = scale;
      g.set_attrs(n.id, attrs);
      ++scaled;
    }
  }
  if (scaled == 0) throw GraphError("data parallel: pre-scaled gradients need a loss backward in the graph");
}

// Whether ZeRO-1 shards `param` over `shards` ranks (OptimizerSpec::shard_updates).
bool sharded(const Graph& g, ValueId param, std::int64_t shards, std::int64_t min_bytes) {
  const Value& p = g.value(param);
  const std::int64_t n = element_count(p.shape);
  return shards > 1 && n % (shards * kShardAlignment) == 0 &&
         n * static_cast<std::int64_t>(dtype_size(p.dtype)) >= min_bytes;
}

// `shards` > 1: a bucket's sharded parameters get a node of their own
// (reduce-scatter), after the rest's all-reduce, at the same place.
GradientMap append_all_reduce(Graph& g, const GradientMap& grads, bool compute_dtype, std::int64_t bucket_bytes,
                              bool pre_scaled, std::int64_t shards, std::int64_t min_bytes) {
  GradientMap reduced;
  std::vector<std::pair<ValueId, ValueId>> casts;  // (a cast's f32 output, the mean it is to widen)
  for (const Bucket& bucket : buckets_of(g, grads, compute_dtype, bucket_bytes)) {
    Bucket whole, cut;  // all-reduced, reduce-scattered
    for (std::size_t i = 0; i < bucket.params.size(); ++i) {
      Bucket& b = sharded(g, bucket.params[i], shards, min_bytes) ? cut : whole;
      b.params.push_back(bucket.params[i]);
      b.in.push_back(bucket.in[i]);
      b.widened.push_back(bucket.widened[i]);
    }
    const std::size_t at = after_last(g, bucket);
    for (const Bucket* b : {&whole, &cut}) {
      if (b->params.empty()) continue;
      const AllReduceAttrs attrs{pre_scaled, b == &cut ? shards : 0};
      const auto out = g.insert_node(at, OpKind::all_reduce_mean, b->in, attrs, Role::grad,
                                     (b == &cut ? "shard_mean_" : "mean_") + g.value(b->in.front()).name);
      for (std::size_t i = 0; i < b->params.size(); ++i) {
        reduced.of_param[b->params[i]] = b->widened[i] < 0 ? out[i] : b->widened[i];
        if (b->widened[i] >= 0) casts.emplace_back(b->widened[i], out[i]);
      }
    }
  }
  for (const auto& [wide, mean] : casts) {  // each cast now widens its mean, after the whole backward pass
    const NodeId cast = g.value(wide).producer, end = static_cast<NodeId>(g.nodes().size()) - 1;
    g.move_after(cast, cast == end ? end - 1 : end, {mean});  // (already last: stays, reading the mean)
  }
  return reduced;
}

// ZeRO-1: one all_gather_shards per sharded parameter, in the order the
// forward first reads them, each at the step's start (or right after the
// cast that makes an fp32 master weight's f16/bf16 copy: that copy is what
// is gathered), and every reader but the update rules reads what it gathers.
void gather_sharded_parameters(Graph& g, const GradientMap& grads, std::int64_t shards, std::int64_t min_bytes) {
  struct Gathered {
    ValueId param, read;  // `read`: the value the forward reads (the parameter or its cast)
    NodeId first_reader;
  };
  std::vector<Gathered> todo;
  for (const auto& [param, grad] : grads.of_param) {
    if (!sharded(g, param, shards, min_bytes)) continue;
    std::vector<NodeId> readers;
    for (NodeId r : g.consumers(param))
      if (!is_update_rule(g.node(r).op)) readers.push_back(r);
    if (readers.empty()) continue;
    ValueId read = param;
    if (readers.size() == 1 && g.node(readers[0]).op == OpKind::cast) {
      const ValueId copy = g.node(readers[0]).outputs[0];
      const DType d = g.value(copy).dtype;
      if (d == DType::f16 || d == DType::bf16) read = copy;
    }
    todo.push_back({param, read, *std::min_element(readers.begin(), readers.end())});
  }
  std::sort(todo.begin(), todo.end(),
            [](const Gathered& a, const Gathered& b) { return a.first_reader < b.first_reader; });
  std::size_t next = 0;  // right after the previous gather: they run in the forward's order
  for (const Gathered& t : todo) {
    const NodeId producer = g.value(t.read).producer;
    const std::size_t at = std::max(next, producer >= 0 ? static_cast<std::size_t>(producer) + 1 : 0);
    const ValueId gathered = g.insert_node(at, OpKind::all_gather_shards, {t.read}, AllReduceAttrs{false, shards},
                                           Role::activation, "gathered_" + g.value(t.read).name)
                                 .front();
    const NodeId gather = g.value(gathered).producer;
    for (NodeId r : g.consumers(t.read))
      if (r != gather && !is_update_rule(g.node(r).op)) g.read_instead(r, t.read, gathered);
    next = static_cast<std::size_t>(gather) + 1;
  }
}

}  // namespace

std::string_view optimizer_name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::sgd: return "sgd";
    case OptimizerKind::adam: return "adam";
    case OptimizerKind::adamw: return "adamw";
    case OptimizerKind::rmsprop: return "rmsprop";
  }
  return "?";
}

OptimizerKind optimizer_from_name(std::string_view name) {
  for (OptimizerKind k : {OptimizerKind::sgd, OptimizerKind::adam, OptimizerKind::adamw, OptimizerKind::rmsprop})
    if (optimizer_name(k) == name) return k;
  throw std::invalid_argument(fmt::format("unknown optimizer '{}' (sgd, adam, adamw, rmsprop)", name));
}

namespace {
// The updates (and what they need: clip scale, scaled gradients). The SGD
// updates of the parameters in `after_every_gradient` (data parallel: those
// all-reduced) also wait for the last gradient, as Adam's always do: each
// bucket's all-reduce then runs beside the earlier layers' backward
// (runtime/cuda/stream_plan.hpp) instead of being waited for by its own
// layer's update right after it.
void append_updates(Graph& g, const GradientMap& grads, const OptimizerSpec& spec, std::optional<ValueId> step,
                    const std::set<ValueId>& after_every_gradient);
}  // namespace

void append_optimizer(Graph& g, const GradientMap& grads, const OptimizerSpec& spec, std::optional<ValueId> step) {
  if (spec.all_reduce_gradients && !grads.of_param.empty()) {
    OptimizerSpec local = spec;
    local.all_reduce_gradients = false;
    const bool pre_scaled = spec.pre_scale_ranks > 1;
    const std::int64_t shards = spec.shard_updates ? spec.pre_scale_ranks : 0;
    if (shards > 1 && spec.clip_grad_norm > 0.0)
      throw GraphError("sharded updates (ZeRO-1) cannot clip gradients: the global norm would need every rank's shard");
    if (pre_scaled) pre_scale_loss_gradients(g, spec.pre_scale_ranks);
    // Layers whose gradients sum every rank's rows need no all-reduce; the rest are bucketed.
    const std::set<ValueId> whole =
        gather_rows_for_gradients(g, grads, pre_scaled ? spec.pre_scale_ranks : 0, spec.weight_gradients);
    GradientMap to_reduce, updated = grads;
    for (const auto& [param, grad] : grads.of_param)
      if (!whole.count(param)) to_reduce.of_param[param] = grad;
    std::set<ValueId> reduced_params;
    if (!to_reduce.of_param.empty()) {
      for (const auto& [param, mean] : append_all_reduce(g, to_reduce, spec.reduce_in_compute_dtype,
                                                         spec.bucket_bytes, pre_scaled, shards, spec.shard_min_bytes)
                                           .of_param) {
        updated.of_param[param] = mean;
        reduced_params.insert(param);
      }
    }
    append_updates(g, updated, local, step, reduced_params);
    if (shards > 1) gather_sharded_parameters(g, to_reduce, shards, spec.shard_min_bytes);
    return;
  }
  append_updates(g, grads, spec, step, {});
}

namespace {

void append_updates(Graph& g, const GradientMap& grads, const OptimizerSpec& spec, std::optional<ValueId> step,
                    const std::set<ValueId>& after_every_gradient) {
  const bool adam = spec.kind == OptimizerKind::adam || spec.kind == OptimizerKind::adamw;
  if (adam && !step) throw GraphError(fmt::format("{} needs the graph's step counter (bias correction)", optimizer_name(spec.kind)));
  if (spec.kind == OptimizerKind::sgd && spec.nesterov && !(spec.momentum > 0.0))
    throw GraphError("sgd: nesterov needs momentum > 0");
  if (grads.of_param.empty()) return;
  std::optional<ValueId> scale;
  if (spec.clip_grad_norm > 0.0) scale = append_clip_scale(g, grads, spec.clip_grad_norm);

  for (const auto& [param, raw_grad] : grads.of_param) {
    const Value p = g.value(param);
    if (adam) {
      std::vector<ValueId> inputs{param, raw_grad, g.state("adam_m_" + p.name, p.shape, DType::f32),
                                  g.state("adam_v_" + p.name, p.shape, DType::f32), *step};
      if (scale) inputs.push_back(*scale);
      const AdamUpdateAttrs attrs{spec.beta1, spec.beta2, spec.eps, spec.weight_decay,
                                  spec.kind == OptimizerKind::adamw};
      // After the last gradient, so a backend can run every Adam update in one launch.
      const std::size_t pos = std::max(earliest_update_position(g, param, inputs), after_last_gradient(g, grads));
      g.insert_node(pos, OpKind::adam_update, inputs, attrs, Role::activation, {});
      continue;
    }
    if (spec.kind == OptimizerKind::rmsprop) {
      std::vector<ValueId> inputs{param, raw_grad, g.state("rms_sq_" + p.name, p.shape, DType::f32)};
      if (spec.momentum > 0.0) inputs.push_back(g.state("rms_buf_" + p.name, p.shape, DType::f32));
      if (spec.centered) inputs.push_back(g.state("rms_avg_" + p.name, p.shape, DType::f32));
      if (scale) inputs.push_back(*scale);
      const RmspropUpdateAttrs attrs{spec.alpha, spec.eps, spec.weight_decay, spec.momentum, spec.centered};
      // After the last gradient, as Adam's: one multi-tensor launch takes every update left.
      const std::size_t pos = std::max(earliest_update_position(g, param, inputs), after_last_gradient(g, grads));
      g.insert_node(pos, OpKind::rmsprop_update, inputs, attrs, Role::activation, {});
      continue;
    }
    ValueId grad = raw_grad;
    if (scale) {
      const std::vector<ValueId> in{raw_grad, *scale};
      grad = g.insert_node(earliest_update_position(g, param, in), OpKind::scale_grad, in, NoAttrs{}, Role::grad,
                           "clipped_" + g.value(raw_grad).name)
                 .front();
    }
    std::vector<ValueId> inputs{param, grad};
    if (spec.momentum > 0.0) inputs.push_back(g.state("vel_" + p.name, p.shape, p.dtype));
    const SgdUpdateAttrs attrs{spec.momentum, spec.weight_decay, spec.nesterov};  // spec.lr is the executors' run state
    const std::size_t earliest = earliest_update_position(g, param, inputs);
    g.insert_node(after_every_gradient.count(param) ? std::max(earliest, after_last_gradient(g, grads)) : earliest,
                  OpKind::sgd_update, inputs, attrs, Role::activation, {});
  }
}

}  // namespace

bool is_update_rule(OpKind op) {
  return op == OpKind::sgd_update || op == OpKind::adam_update || op == OpKind::rmsprop_update;
}

}  // namespace sg
