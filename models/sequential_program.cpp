#include "models/sequential_program.hpp"

#include <algorithm>

#include "graph/channels_last_pass.hpp"
#include "graph/filter_layout_pass.hpp"
#include "graph/training_graph.hpp"

namespace sg {

SequentialSpec sequential_for_target(SequentialSpec spec, ProgramTarget target) {
  if (target == ProgramTarget::cuda && !is_half_width_float(spec.compute_dtype)) spec.compute_dtype = DType::f16;
  return spec;
}

namespace {

// The steps with channels-last convolution layers, or nothing when the
// model has no convolution.
std::optional<ChannelsLastVariant> channels_last_variant(const SequentialSpec& train, const OptimizerSpec& optimizer,
                                                         const SequentialSpec& eval, const FusionOptions& fusion) {
  auto forward = rewrite_channels_last(build_sequential_forward(train));
  if (!forward) return std::nullopt;
  // The filters' channels-last copies go in before autodiff, so the weight
  // gradients write [O,KH,KW,C] too and the copies' gradients turn them back
  // (graph/filter_layout_pass.hpp).
  use_channels_last_filters(forward->graph);
  ChannelsLastVariant v;
  v.inner_exits = forward->inner_exits;
  v.batch_norms = forward->batch_norms;
  const ValueId loss = forward->graph.value_named(names::loss);
  const ValueId step = forward->graph.value_named(names::step);
  v.train = build_training_stages(std::move(forward->graph), loss, optimizer, fusion, step).fused;
  v.train_data = mlp_data_bindings(v.train, train.batch);
  v.eval = rewrite_channels_last(build_sequential_eval(eval))->graph;
  use_channels_last_filters(v.eval);
  fuse(v.eval, fusion);
  v.eval_data = mlp_data_bindings(v.eval, eval.batch);
  return v;
}

}  // namespace

TrainingProgram build_sequential_program(const SequentialTraining& t, std::int64_t train_rows, std::int64_t test_rows,
                                         ProgramTarget target) {
  TrainingProgram p;
  SequentialSpec train = sequential_for_target(t.model, target);
  train.dataset_rows = train_rows;
  OptimizerSpec optimizer = t.optimizer;
  if (t.data_ranks > 0) shard_for_rank(train, optimizer, t.data_rank, t.data_ranks);
  p.train = build_sequential_training_stages(train, optimizer, t.fusion).fused;
  p.train_data = mlp_data_bindings(p.train, train.batch);
  p.train_data.ranks = std::max<std::int64_t>(1, t.data_ranks);

  SequentialSpec eval = sequential_for_target(t.model, target);
  eval.dataset_rows = test_rows;
  eval.batch = eval_batch_for(test_rows, t.eval_batch);
  p.eval = build_sequential_eval(eval);
  fuse(p.eval, t.fusion);
  p.eval_data = mlp_data_bindings(p.eval, eval.batch);

  p.init = sequential_initial_parameters(t.model.input_shape, t.model.layers, t.init_seed);
  p.learning_rate = t.optimizer.lr;
  if (target == ProgramTarget::cuda) {
    p.channels_last = channels_last_variant(train, optimizer, eval, t.fusion);
    if (p.channels_last) p.channels_last->train_data.ranks = p.train_data.ranks;
  }
  return p;
}

}  // namespace sg
