#include "models/mlp.hpp"

#include <array>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "models/model_pieces.hpp"
#include "models/param_init.hpp"

namespace sg {

std::string names::weight(std::size_t layer) { return fmt::format("w{}", layer); }
std::string names::bias(std::size_t layer) { return fmt::format("b{}", layer); }
std::string names::running_mean(std::size_t layer) { return fmt::format("running_mean{}", layer); }
std::string names::running_var(std::size_t layer) { return fmt::format("running_var{}", layer); }

namespace {
constexpr std::array kActivationNames = {
    std::pair{MlpActivation::relu, "relu"},     std::pair{MlpActivation::gelu, "gelu"},
    std::pair{MlpActivation::gelu_tanh, "gelu_tanh"}, std::pair{MlpActivation::silu, "silu"},
    std::pair{MlpActivation::tanh, "tanh"},     std::pair{MlpActivation::sigmoid, "sigmoid"},
    std::pair{MlpActivation::identity, "identity"},
};
constexpr std::array kLossNames = {
    std::pair{MlpLoss::softmax_xent, "softmax_xent"}, std::pair{MlpLoss::mse, "mse"}, std::pair{MlpLoss::l1, "l1"}};
}  // namespace

std::string_view activation_name(MlpActivation a) {
  for (const auto& [k, n] : kActivationNames)
    if (k == a) return n;
  return "?";
}
std::string_view loss_name(MlpLoss l) {
  for (const auto& [k, n] : kLossNames)
    if (k == l) return n;
  return "?";
}
MlpActivation activation_from_name(std::string_view name) {
  for (const auto& [k, n] : kActivationNames)
    if (name == n) return k;
  throw std::invalid_argument(fmt::format("unknown activation '{}'", name));
}
MlpLoss loss_from_name(std::string_view name) {
  for (const auto& [k, n] : kLossNames)
    if (name == n) return k;
  throw std::invalid_argument(fmt::format("unknown loss '{}'", name));
}

void validate_mlp_spec(const MlpSpec& spec) {
  if (spec.layers.size() < 2) throw GraphError("mlp: needs at least an input and an output size");
  for (auto s : spec.layers)
    if (s <= 0) throw GraphError(fmt::format("mlp: layer size {} must be > 0", s));
  if (spec.batch <= 0 || spec.batch > spec.dataset_rows)
    throw GraphError(fmt::format("mlp: batch {} must be in 1..{} (dataset rows)", spec.batch, spec.dataset_rows));
  if (!is_floating(spec.weight_dtype) || !is_floating(spec.compute_dtype))
    throw GraphError("mlp: weight and compute dtypes must be f32, f16 or bf16");
  if (!(spec.dropout >= 0.0 && spec.dropout < 1.0))
    throw GraphError(fmt::format("mlp: dropout {} must be in [0, 1)", spec.dropout));
  if (!(spec.label_smoothing >= 0.0 && spec.label_smoothing <= 1.0))
    throw GraphError(fmt::format("mlp: label smoothing {} must be in [0, 1]", spec.label_smoothing));
  if (spec.label_smoothing > 0.0 && spec.loss != MlpLoss::softmax_xent)
    throw GraphError(fmt::format("mlp: label smoothing applies to softmax_xent, not to loss {}", loss_name(spec.loss)));
  if (spec.feature_dtype != DType::u8 && spec.feature_dtype != DType::f16 && spec.feature_dtype != DType::f32)
    throw GraphError(fmt::format("mlp: feature dtype {} must be u8, f16 or f32", dtype_name(spec.feature_dtype)));
  if (spec.target_width < 0) throw GraphError(fmt::format("mlp: target width {} must be >= 0", spec.target_width));
  if (spec.target_width > 0 && spec.target_width != spec.layers.back())
    throw GraphError(fmt::format("mlp: {} float targets per example but {} outputs", spec.target_width,
                                 spec.layers.back()));
  if ((spec.target_width > 0) != is_regression(spec.loss))
    throw GraphError(fmt::format("mlp: loss {} needs {}", loss_name(spec.loss),
                                 is_regression(spec.loss) ? "float targets (target width > 0)" : "class labels"));
}

namespace {

using model_pieces::add_activation;
using model_pieces::as_compute;

// `training`: the training graph's forward (dropout applies); the eval graph
// has none.
ValueId add_layers(Graph& g, const MlpSpec& spec, ValueId x, bool training) {
  ValueId h = x;
  const std::size_t count = spec.layers.size() - 1;
  for (std::size_t l = 1; l <= count; ++l) {
    const auto in = spec.layers[l - 1];
    const auto out = spec.layers[l];
    const ValueId w = g.param(names::weight(l), {out, in}, spec.weight_dtype);
    const ValueId b = g.param(names::bias(l), {out}, spec.weight_dtype);
    h = g.linear(h, as_compute(g, w, spec.compute_dtype), as_compute(g, b, spec.compute_dtype));
    if (l == count) break;
    h = add_activation(g, spec.activation, h);
    if (training && spec.dropout > 0.0) {
      const DropoutAttrs attrs{spec.dropout, spec.dropout_seed, static_cast<std::int64_t>(l)};
      h = g.append_node(OpKind::dropout, {h, g.value_named(names::step)}, attrs, Role::activation).front();
    }
  }
  return h;
}

ValueId add_loss(Graph& g, const MlpSpec& spec, ValueId out, ValueId y) {
  return model_pieces::add_loss(g, spec.loss, spec.label_smoothing, out, y);
}

model_pieces::FetchedBatch add_batch_fetch(Graph& g, const MlpSpec& spec) {
  return model_pieces::add_batch_fetch(g, model_pieces::batch_source(spec));
}

}  // namespace

Graph build_mlp_forward(const MlpSpec& spec) {
  validate_mlp_spec(spec);
  Graph g;
  const auto batch = add_batch_fetch(g, spec);
  const ValueId logits = add_layers(g, spec, batch.x, /*training=*/true);
  g.mark_output(add_loss(g, spec, logits, batch.y));
  return g;
}

Graph build_mlp_eval(const MlpSpec& spec) {
  validate_mlp_spec(spec);
  Graph g;
  const auto batch = add_batch_fetch(g, spec);
  const ValueId logits = add_layers(g, spec, batch.x, /*training=*/false);
  model_pieces::add_eval_outputs(g, spec.loss, spec.label_smoothing, logits, batch.y);
  return g;
}

Graph build_mlp_predict(const MlpSpec& spec) {
  validate_mlp_spec(spec);
  Graph g;
  const ValueId x = model_pieces::add_feature_fetch(g, model_pieces::batch_source(spec));
  const ValueId out = add_layers(g, spec, x, /*training=*/false);
  g.mark_output(out);
  g.advance_step(g.value_named(names::step));
  return g;
}

TrainingGraphStages build_training_stages(const MlpSpec& spec, const OptimizerSpec& sgd, const FusionOptions& fusion) {
  Graph forward = build_mlp_forward(spec);
  const ValueId loss = forward.value_named(names::loss);
  const ValueId step = forward.value_named(names::step);
  return build_training_stages(std::move(forward), loss, sgd, fusion, step);
}

DataBindings mlp_data_bindings(const Graph& g, std::int64_t batch) {
  DataBindings d;
  d.images = g.value_named(names::images);
  d.labels = g.value_named(names::labels);
  d.perm = g.value_named(names::perm);
  d.step = g.value_named(names::step);
  d.loss = g.value_named(names::loss);
  d.correct = g.find_value(names::correct);
  d.batch = batch;
  return d;
}

std::vector<ParameterInit> mlp_initial_parameters(const std::vector<std::int64_t>& layers, std::uint64_t seed) {
  std::vector<ParameterInit> out;
  for (std::size_t l = 1; l < layers.size(); ++l) {
    const auto in = layers[l - 1], units = layers[l];
    const auto index = static_cast<std::uint64_t>(2 * (l - 1));
    out.push_back({names::weight(l), {units, in}, linear_init(units * in, in, param_key(seed, index))});
    out.push_back({names::bias(l), {units}, linear_init(units, in, param_key(seed, index + 1))});
  }
  return out;
}

}  // namespace sg
