#include "models/model_pieces.hpp"

namespace sg::model_pieces {

BatchSource batch_source(const MlpSpec& spec) {
  return {spec.dataset_rows, spec.layers.front(), spec.feature_dtype, spec.target_width,
          spec.batch,        spec.compute_dtype,  spec.input_scale,   spec.input_shift,
          spec.batch_rank,   spec.batch_ranks};
}

FetchedBatch add_batch_fetch(Graph& g, const BatchSource& s) {
  const auto rows = s.dataset_rows;
  const ValueId images = g.input(names::images, {rows, s.features}, s.feature_dtype);
  const bool targets = s.target_width > 0;
  const ValueId labels = targets ? g.label(names::labels, {rows, s.target_width}, DType::f32)
                                 : g.label(names::labels, {rows}, DType::u8);
  const ValueId perm = g.input(names::perm, {rows}, DType::i32);
  const ValueId step = g.state(names::step, {1}, DType::i32);
  const ValueId idx = g.batch_indices(perm, step, s.batch, s.rank, s.ranks);
  const ValueId x = g.gather_rows(images, idx, s.compute_dtype, s.input_scale, s.input_shift, "x");
  const ValueId y = g.gather_rows(labels, idx, targets ? DType::f32 : DType::i32, 1.0, 0.0, "y");
  return {x, y};
}

ValueId add_feature_fetch(Graph& g, const BatchSource& s) {
  const auto rows = s.dataset_rows;
  const ValueId features = g.input(names::images, {rows, s.features}, s.feature_dtype);
  const ValueId perm = g.input(names::perm, {rows}, DType::i32);
  const ValueId step = g.state(names::step, {1}, DType::i32);
  const ValueId idx = g.batch_indices(perm, step, s.batch, s.rank, s.ranks);
  return g.gather_rows(features, idx, s.compute_dtype, s.input_scale, s.input_shift, "x");
}

ValueId as_compute(Graph& g, ValueId param, DType compute) {
  return g.value(param).dtype == compute ? param : g.cast(param, compute);
}

ValueId add_activation(Graph& g, MlpActivation a, ValueId h) {
  const auto unary = [&](OpKind op) { return g.append_node(op, {h}, NoAttrs{}, Role::activation).front(); };
  switch (a) {
    case MlpActivation::relu: return g.relu(h);
    case MlpActivation::gelu: return g.gelu(h);
    case MlpActivation::gelu_tanh: return unary(OpKind::gelu_tanh);
    case MlpActivation::silu: return unary(OpKind::silu);
    case MlpActivation::tanh: return unary(OpKind::tanh);
    case MlpActivation::sigmoid: return unary(OpKind::sigmoid);
    case MlpActivation::identity: return h;
  }
  throw GraphError("model: unknown activation");
}

void add_eval_outputs(Graph& g, MlpLoss loss, double label_smoothing, ValueId out, ValueId y) {
  g.mark_output(add_loss(g, loss, label_smoothing, out, y));
  if (!is_regression(loss)) g.mark_output(g.count_correct(out, y));
  g.advance_step(g.value_named(names::step));
}

ValueId add_loss(Graph& g, MlpLoss loss, double label_smoothing, ValueId out, ValueId y) {
  switch (loss) {
    case MlpLoss::softmax_xent:
      if (label_smoothing == 0.0) return g.softmax_xent(out, y);
      return g.append_node(OpKind::softmax_xent_smoothed, {out, y}, LabelSmoothingAttrs{label_smoothing},
                           Role::activation, names::loss)
          .front();
    case MlpLoss::mse:
      return g.append_node(OpKind::mse_loss, {out, y}, NoAttrs{}, Role::activation, names::loss).front();
    case MlpLoss::l1:
      return g.append_node(OpKind::l1_loss, {out, y}, NoAttrs{}, Role::activation, names::loss).front();
  }
  throw GraphError("model: unknown loss");
}

}  // namespace sg::model_pieces
