#include "models/mlp.hpp"

#include <fmt/format.h>

#include "models/param_init.hpp"

namespace sg {

std::string names::weight(std::size_t layer) { return fmt::format("w{}", layer); }
std::string names::bias(std::size_t layer) { return fmt::format("b{}", layer); }

void validate_mlp_spec(const MlpSpec& spec) {
  if (spec.layers.size() < 2) throw GraphError("mlp: needs at least an input and an output size");
  for (auto s : spec.layers)
    if (s <= 0) throw GraphError(fmt::format("mlp: layer size {} must be > 0", s));
  if (spec.batch <= 0 || spec.batch > spec.dataset_rows)
    throw GraphError(fmt::format("mlp: batch {} must be in 1..{} (dataset rows)", spec.batch, spec.dataset_rows));
  if (!is_floating(spec.weight_dtype) || !is_floating(spec.compute_dtype))
    throw GraphError("mlp: weight and compute dtypes must be f32 or f16");
}

namespace {

struct FetchedBatch {
  ValueId x, y;
};

FetchedBatch add_batch_fetch(Graph& g, const MlpSpec& spec) {
  const auto rows = spec.dataset_rows;
  const ValueId images = g.input(names::images, {rows, spec.layers.front()}, DType::u8);
  const ValueId labels = g.label(names::labels, {rows}, DType::u8);
  const ValueId perm = g.input(names::perm, {rows}, DType::i32);
  const ValueId step = g.state(names::step, {1}, DType::i32);
  const ValueId idx = g.batch_indices(perm, step, spec.batch);
  const ValueId x = g.gather_rows(images, idx, spec.compute_dtype, spec.input_scale, spec.input_shift, "x");
  const ValueId y = g.gather_rows(labels, idx, DType::i32, 1.0, 0.0, "y");
  return {x, y};
}

// A parameter as the matmuls see it: cast to the compute dtype when the
// stored (master) dtype differs.
ValueId as_compute(Graph& g, ValueId param, DType compute) {
  return g.value(param).dtype == compute ? param : g.cast(param, compute);
}

ValueId add_layers(Graph& g, const MlpSpec& spec, ValueId x) {
  ValueId h = x;
  const std::size_t count = spec.layers.size() - 1;
  for (std::size_t l = 1; l <= count; ++l) {
    const auto in = spec.layers[l - 1];
    const auto out = spec.layers[l];
    const ValueId w = g.param(names::weight(l), {out, in}, spec.weight_dtype);
    const ValueId b = g.param(names::bias(l), {out}, spec.weight_dtype);
    h = g.linear(h, as_compute(g, w, spec.compute_dtype), as_compute(g, b, spec.compute_dtype));
    if (l < count) h = g.relu(h);
  }
  return h;
}

}  // namespace

Graph build_mlp_forward(const MlpSpec& spec) {
  validate_mlp_spec(spec);
  Graph g;
  const auto batch = add_batch_fetch(g, spec);
  const ValueId logits = add_layers(g, spec, batch.x);
  const ValueId loss = g.softmax_xent(logits, batch.y);
  g.mark_output(loss);
  return g;
}

Graph build_mlp_eval(const MlpSpec& spec) {
  validate_mlp_spec(spec);
  Graph g;
  const auto batch = add_batch_fetch(g, spec);
  const ValueId logits = add_layers(g, spec, batch.x);
  g.mark_output(g.softmax_xent(logits, batch.y));
  g.mark_output(g.count_correct(logits, batch.y));
  g.advance_step(g.value_named(names::step));
  return g;
}

TrainingGraphStages build_training_stages(const MlpSpec& spec, const SgdSpec& sgd, const FusionOptions& fusion) {
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
