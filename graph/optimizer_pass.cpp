#include "graph/optimizer_pass.hpp"

#include <algorithm>
#include <map>
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

// The layer a gradient belongs to: the upstream gradient its producer reads
// (dW = matmul(X^T, dZ) and db = reduce_rows(dZ) share dZ), looking through
// the casts of fp32 master weights; the gradient itself when it reads none.
ValueId layer_key(const Graph& g, ValueId grad) {
  NodeId n = g.value(grad).producer;
  while (g.node(n).op == OpKind::cast && g.value(g.node(n).inputs[0]).producer >= 0)
    n = g.value(g.node(n).inputs[0]).producer;
  for (ValueId in : g.node(n).inputs)
    if (g.value(in).role == Role::grad) return in;
  return grad;
}

// One all_reduce_mean per layer bucket, each right after the last gradient of
// its bucket; returns the map with the reduced gradients.
GradientMap append_all_reduce(Graph& g, const GradientMap& grads) {
  std::map<ValueId, std::vector<ValueId>> buckets;  // layer key -> its parameters
  for (const auto& [param, grad] : grads.of_param) buckets[layer_key(g, grad)].push_back(param);
  GradientMap reduced;
  for (const auto& [key, params] : buckets) {
    std::vector<ValueId> in;
    std::size_t pos = 0;
    for (ValueId p : params) {
      in.push_back(grads.of_param.at(p));
      pos = std::max(pos, static_cast<std::size_t>(g.value(in.back()).producer) + 1);
    }
    const auto out = g.insert_node(pos, OpKind::all_reduce_mean, in, NoAttrs{}, Role::grad,
                                   "mean_" + g.value(in.front()).name);
    for (std::size_t i = 0; i < params.size(); ++i) reduced.of_param[params[i]] = out[i];
  }
  return reduced;
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
// The updates (and what they need: clip scale, scaled gradients). With
// `after_every_gradient` (data parallel) every SGD update also waits for the
// last gradient, as Adam's always do: each bucket's all-reduce then runs
// beside the earlier layers' backward (runtime/cuda/stream_plan.hpp) instead
// of being waited for by its own layer's update right after it.
void append_updates(Graph& g, const GradientMap& grads, const OptimizerSpec& spec, std::optional<ValueId> step,
                    bool after_every_gradient);
}  // namespace

void append_optimizer(Graph& g, const GradientMap& grads, const OptimizerSpec& spec, std::optional<ValueId> step) {
  if (spec.all_reduce_gradients && !grads.of_param.empty()) {
    OptimizerSpec local = spec;
    local.all_reduce_gradients = false;
    append_updates(g, append_all_reduce(g, grads), local, step, /*after_every_gradient=*/true);
    return;
  }
  append_updates(g, grads, spec, step, false);
}

namespace {

void append_updates(Graph& g, const GradientMap& grads, const OptimizerSpec& spec, std::optional<ValueId> step,
                    bool after_every_gradient) {
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
    g.insert_node(after_every_gradient ? std::max(earliest, after_last_gradient(g, grads)) : earliest,
                  OpKind::sgd_update, inputs, attrs, Role::activation, {});
  }
}

}  // namespace

}  // namespace sg
