// Lowering: the batch normalisation nodes (issue 37) by our per-channel
// kernels (ops/cuda/batch_norm.hpp), one launch each: the training
// normalisation, its backward (a gradient nothing reads is not written), the
// running-statistics update (f32 state, in place; with the training
// normalisation of the same X in one launch where both are free) and inference. gamma and
// beta have X's type (the model casts fp32 master parameters first).
#include "ops/cuda/batch_norm.hpp"
#include "runtime/cuda/lowerings/lone_units.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"

namespace sg::cuda {
namespace {

bool batch_norm_op(OpKind op) {
  return op == OpKind::batch_norm || op == OpKind::batch_norm_backward || op == OpKind::batch_norm_stats_update ||
         op == OpKind::batch_norm_inference;
}

// Which inputs are f32 running statistics (the others have X's type).
bool running_statistic(OpKind op, std::size_t slot) {
  return (op == OpKind::batch_norm_stats_update && slot >= 1) || (op == OpKind::batch_norm_inference && slot >= 3);
}

// The kernels' view of X [N, C, ...] (`x_shape`): eps from `norm`, momentum from `stats`.
BatchNormShape shape_of(const Shape& x_shape, const Node& norm, const Node& stats) {
  BatchNormShape s;
  s.n = x_shape[0];
  s.channels = x_shape[1];
  for (std::size_t d = 2; d < x_shape.size(); ++d) s.plane *= x_shape[d];
  s.eps = static_cast<float>(norm.attr<BatchNormAttrs>().eps);
  s.momentum = static_cast<float>(stats.attr<BatchNormAttrs>().momentum);
  return s;
}

class BatchNormLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "batch_norm"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    if (unit.fusion_group >= 0 || unit.nodes.size() != 1) return std::nullopt;
    const sg::Graph& g = cover.graph();
    const Node& n = g.node(unit.nodes.front());
    if (!batch_norm_op(n.op)) return std::nullopt;
    const DType t = g.value(n.inputs[0]).dtype;
    if (!is_floating(t)) return std::nullopt;
    for (std::size_t slot = 0; slot < n.inputs.size(); ++slot)
      if (g.value(n.inputs[slot]).dtype != (running_statistic(n.op, slot) ? DType::f32 : t)) return std::nullopt;
    Match m = single_unit(unit);
    // The running statistics' update takes the training normalisation of the
    // same X along (a model builds them side by side): one launch, the
    // moments once.
    if (n.op == OpKind::batch_norm_stats_update)
      for (NodeId reader : g.consumers(n.inputs[0]))
        if (const CoverUnit* u = free_lone_unit(cover, reader);
            u && g.node(reader).op == OpKind::batch_norm && g.node(reader).inputs[0] == n.inputs[0] &&
            g.value(g.node(reader).inputs[1]).dtype == t && g.value(g.node(reader).inputs[2]).dtype == t) {
          m.units.push_back(u->id);
          break;
        }
    return m;
  }

  std::string describe(const sg::Graph& g, const Launch& l) const override {
    if (l.nodes.size() == 2) return "train + running statistics";
    const OpKind op = g.node(l.nodes.front()).op;
    return op == OpKind::batch_norm            ? "train"
           : op == OpKind::batch_norm_backward ? "backward"
           : op == OpKind::batch_norm_stats_update ? "running statistics"
                                                   : "inference";
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    if (l.nodes.size() == 2) return record_train_and_statistics(l, c);
    const Node& n = g.node(l.nodes.front());
    const OpKind op = n.op;
    const BatchNormShape s = shape_of(g.value(n.inputs[op == OpKind::batch_norm_backward ? 1 : 0]).shape, n, n);
    auto out_ptr = [&](ValueId v) { return launch_writes(l, v) ? c.ptr(v) : nullptr; };
    std::vector<const void*> in;
    for (ValueId v : n.inputs) in.push_back(c.ptr(v));
    std::vector<void*> out;
    for (ValueId v : n.outputs) out.push_back(op == OpKind::batch_norm_backward ? out_ptr(v) : c.ptr(v));
    // The stats update writes its inputs 1 and 2 in place.
    float* running_mean = op == OpKind::batch_norm_stats_update ? static_cast<float*>(c.ptr(n.inputs[1])) : nullptr;
    float* running_var = op == OpKind::batch_norm_stats_update ? static_cast<float*>(c.ptr(n.inputs[2])) : nullptr;
    std::function<void(cudaStream_t)> run;
    with_float_type(g.value(n.inputs[0]).dtype, [&](auto tag) {
      using T = decltype(tag);
      const auto* in0 = static_cast<const T*>(in[0]);
      const auto* in1 = static_cast<const T*>(in[1]);
      const auto* in2 = static_cast<const T*>(in[2]);
      switch (op) {
        case OpKind::batch_norm: {
          auto* y = static_cast<T*>(out[0]);
          run = [=](cudaStream_t st) { launch_batch_norm_forward(in0, in1, in2, s, y, st); };
          break;
        }
        case OpKind::batch_norm_backward: {
          auto *dx = static_cast<T*>(out[0]), *dgamma = static_cast<T*>(out[1]), *dbeta = static_cast<T*>(out[2]);
          run = [=](cudaStream_t st) { launch_batch_norm_backward(in0, in1, in2, s, dx, dgamma, dbeta, st); };
          break;
        }
        case OpKind::batch_norm_stats_update:
          run = [=](cudaStream_t st) { launch_batch_norm_stats_update(in0, s, running_mean, running_var, st); };
          break;
        default: {
          const auto* mean = static_cast<const float*>(in[3]);
          const auto* var = static_cast<const float*>(in[4]);
          auto* y = static_cast<T*>(out[0]);
          run = [=](cudaStream_t st) { launch_batch_norm_inference(in0, in1, in2, mean, var, s, y, st); };
          break;
        }
      }
    });
    return std::make_unique<BoundLaunch>(std::move(run), fmt::format("{} channels of {} values", s.channels,
                                                                      s.n * s.plane));
  }

 private:
  // batch_norm_stats_update and batch_norm of one X: the forward kernel with the running statistics.
  static std::unique_ptr<RecordedLaunch> record_train_and_statistics(const Launch& l, const BindContext& c) {
    const sg::Graph& g = c.graph();
    const Node* stats = &g.node(l.nodes[0]);
    const Node* train = &g.node(l.nodes[1]);
    if (stats->op != OpKind::batch_norm_stats_update) std::swap(stats, train);
    const BatchNormShape s = shape_of(g.value(train->inputs[0]).shape, *train, *stats);
    auto* running_mean = static_cast<float*>(c.ptr(stats->inputs[1]));
    auto* running_var = static_cast<float*>(c.ptr(stats->inputs[2]));
    std::function<void(cudaStream_t)> run;
    with_float_type(g.value(train->inputs[0]).dtype, [&](auto tag) {
      using T = decltype(tag);
      const auto* x = static_cast<const T*>(c.ptr(train->inputs[0]));
      const auto* gamma = static_cast<const T*>(c.ptr(train->inputs[1]));
      const auto* beta = static_cast<const T*>(c.ptr(train->inputs[2]));
      auto* y = static_cast<T*>(c.ptr(train->outputs[0]));
      run = [=](cudaStream_t st) { launch_batch_norm_forward(x, gamma, beta, s, y, st, running_mean, running_var); };
    });
    return std::make_unique<BoundLaunch>(std::move(run), fmt::format("{} channels of {} values, running statistics",
                                                                      s.channels, s.n * s.plane));
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_batch_norm_lowering() { return std::make_unique<BatchNormLowering>(); }

}  // namespace sg::cuda
