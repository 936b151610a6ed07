// Lowering: the batch normalisation nodes (issue 37) by our per-channel
// kernels (ops/cuda/batch_norm.hpp): the training normalisation with the
// running-statistics update of the same X (f32 state, in place), the
// residual add that alone reads its output and the ReLU that alone reads
// either, in one launch where they are free; the backward with the
// relu_backward that alone feeds it and the add of two gradients that alone
// feeds that (a gradient nothing reads is not written); either statistics
// node alone; inference. gamma and beta have X's type (the model casts fp32
// master parameters first). Channels-last X ([N, H, W, C]) is the [N*H*W, C]
// matrix to the kernels; tall ones of those (and tall [N, C]) take the
// whole-GPU rows path, which asks for the program's shared workspace and a
// finish counter of the launch's own (BatchNormRowsScratch).
#include <memory>

#include "ops/cuda/batch_norm.hpp"
#include "ops/cuda/cuda_resources.hpp"
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

// The kernels' view of X (`x_shape`): batch_norm_layout's (n, channels,
// plane); eps from `norm`, momentum from `stats`.
BatchNormShape shape_of(const Shape& x_shape, const Node& norm, const Node& stats) {
  BatchNormShape s;
  const BatchNormLayout l = batch_norm_layout(x_shape, norm.attr<BatchNormAttrs>());
  s.n = l.n;
  s.channels = l.channels;
  s.plane = l.plane;
  s.eps = static_cast<float>(norm.attr<BatchNormAttrs>().eps);
  s.momentum = static_cast<float>(stats.attr<BatchNormAttrs>().momentum);
  return s;
}

// The nodes of one launch: `norm` (any of the four ops), the stats update
// riding with a training batch_norm, a residual add of its output and the
// ReLU after either (forward), or the relu_backward before the backward and
// the add of two gradients before that (backward); -1 where absent.
struct BatchNormNodes {
  NodeId norm = -1, stats = -1, add = -1, relu = -1;
  ValueId residual = -1;  // forward: the add's other input
};

class BatchNormLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "batch_norm"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    if (unit.fusion_group >= 0 || unit.nodes.size() != 1) return std::nullopt;
    const sg::Graph& g = cover.graph();
    const Node& n = g.node(unit.nodes.front());
    if (!batch_norm_op(n.op) || !types_fit(g, n)) return std::nullopt;
    Match m = single_unit(unit);
    BatchNormNodes nodes{n.id, -1, -1};
    // The running statistics' update takes the training normalisation of the
    // same X along (a model builds them side by side): one launch, the
    // moments once.
    if (n.op == OpKind::batch_norm_stats_update) {
      nodes = {-1, n.id, -1};
      for (NodeId reader : g.consumers(n.inputs[0]))
        if (const CoverUnit* u = free_lone_unit(cover, reader);
            u && g.node(reader).op == OpKind::batch_norm && g.node(reader).inputs[0] == n.inputs[0] &&
            types_fit(g, g.node(reader)) &&
            g.node(reader).attr<BatchNormAttrs>().channels_last == n.attr<BatchNormAttrs>().channels_last) {
          m.units.push_back(u->id);
          nodes.norm = reader;
          break;
        }
    }
    if (nodes.norm >= 0 && g.node(nodes.norm).op == OpKind::batch_norm) {
      const NodeId position = nodes.stats >= 0 ? nodes.stats : nodes.norm;  // where the launch runs
      ValueId out = g.node(nodes.norm).outputs[0];
      if (const CoverUnit* add = free_sole_reader(cover, out, OpKind::add)) {
        const Node& a = g.node(add->nodes.front());
        const ValueId other = a.inputs[0] == out ? a.inputs[1] : a.inputs[0];
        const Value& r = g.value(other);
        if (other != out && r.shape == g.value(out).shape && r.dtype == g.value(out).dtype && r.producer < position) {
          m.units.push_back(add->id);
          nodes.add = a.id;
          nodes.residual = other;
          out = a.outputs[0];
        }
      }
      if (const CoverUnit* relu = free_sole_reader(cover, out, OpKind::relu)) {
        m.units.push_back(relu->id);
        nodes.relu = relu->nodes.front();
      }
    } else if (n.op == OpKind::batch_norm_backward) {
      const ValueId dy = n.inputs[0];
      const NodeId producer = g.value(dy).producer;
      const auto same_as_dy = [&](ValueId v) {
        return g.value(v).shape == g.value(dy).shape && g.value(v).dtype == g.value(dy).dtype;
      };
      if (producer >= 0 && g.node(producer).op == OpKind::relu_backward && sole_reader(g, dy) == n.id &&
          same_as_dy(g.node(producer).inputs[0]) && same_as_dy(g.node(producer).inputs[1]))
        if (const CoverUnit* relu = free_lone_unit(cover, producer)) {
          m.units.push_back(relu->id);
          nodes.relu = producer;
          // The add of two branches' gradients that alone feeds the relu_backward (a residual block's input).
          const ValueId sum = g.node(producer).inputs[0];
          const NodeId adder = g.value(sum).producer;
          if (adder >= 0 && g.node(adder).op == OpKind::add && sole_reader(g, sum) == producer &&
              same_as_dy(g.node(adder).inputs[0]) && same_as_dy(g.node(adder).inputs[1]))
            if (const CoverUnit* add = free_lone_unit(cover, adder)) {
              m.units.push_back(add->id);
              nodes.add = adder;
            }
        }
    }
    if (nodes.norm < 0) nodes.norm = nodes.stats;  // the stats update alone
    m.detail = nodes;
    return m;
  }

  std::string describe(const sg::Graph& g, const Launch& l) const override {
    const auto& nodes = detail_of<BatchNormNodes>(l);
    const OpKind op = g.node(nodes.norm).op;
    std::string text = op == OpKind::batch_norm               ? "train"
                       : op == OpKind::batch_norm_backward     ? "backward"
                       : op == OpKind::batch_norm_stats_update ? "running statistics"
                                                               : "inference";
    if (op == OpKind::batch_norm && nodes.stats >= 0) text += " + running statistics";
    if (op == OpKind::batch_norm_backward) {
      if (nodes.add >= 0) text += " + add";  // the order they run in
      if (nodes.relu >= 0) text += " + relu_backward";
      return text;
    }
    if (nodes.add >= 0) text += " + add";
    if (nodes.relu >= 0) text += " + relu";
    return text;
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto& nodes = detail_of<BatchNormNodes>(l);
    const Node& n = g.node(nodes.norm);
    const OpKind op = n.op;
    const Node& stats = g.node(nodes.stats >= 0 ? nodes.stats : nodes.norm);
    const bool backward = op == OpKind::batch_norm_backward;
    const BatchNormShape s = shape_of(g.value(n.inputs[backward ? 1 : 0]).shape, n, stats);
    const auto ptr = [&](ValueId v) { return c.ptr(v); };
    const auto written = [&](ValueId v) { return launch_writes(l, v) ? c.ptr(v) : nullptr; };
    const Node* relu = nodes.relu >= 0 ? &g.node(nodes.relu) : nullptr;
    float* running_mean = nodes.stats >= 0 ? static_cast<float*>(ptr(stats.inputs[1])) : nullptr;
    float* running_var = nodes.stats >= 0 ? static_cast<float*>(ptr(stats.inputs[2])) : nullptr;
    // The rows path's scratch (training ops of tall [rows, C] X): read when
    // enqueuing, as the shared workspace's address is final only then.
    const std::size_t workspace_bytes = op == OpKind::batch_norm_inference ? 0 : batch_norm_workspace_bytes(s);
    void* const* workspace = workspace_bytes > 0 ? c.workspace(workspace_bytes) : nullptr;
    std::shared_ptr<DeviceBuffer> finished;
    if (workspace) {
      finished = std::make_shared<DeviceBuffer>(sizeof(unsigned));
      finished->fill_bytes(0);
    }
    const bool dependent = c.options().dependent_launch;
    const auto scratch = [workspace, finished, dependent] {
      return workspace ? BatchNormRowsScratch{*workspace, finished->as<unsigned>(), dependent} : BatchNormRowsScratch{};
    };
    std::function<void(cudaStream_t)> run;
    with_float_type(g.value(n.inputs[0]).dtype, [&](auto tag) {
      using T = decltype(tag);
      const auto in = [&](const Node& node, std::size_t i) { return static_cast<const T*>(ptr(node.inputs[i])); };
      switch (op) {
        case OpKind::batch_norm: {  // [stats +] batch_norm [+ add] [+ relu]: y is the last one's output
          const Node& last = relu ? *relu : g.node(nodes.add >= 0 ? nodes.add : nodes.norm);
          auto* y = static_cast<T*>(ptr(last.outputs[0]));
          const T *x = in(n, 0), *gamma = in(n, 1), *beta = in(n, 2);
          const T* residual = nodes.residual >= 0 ? static_cast<const T*>(ptr(nodes.residual)) : nullptr;
          const bool with_relu = relu != nullptr;
          run = [=](cudaStream_t st) {
            launch_batch_norm_forward(x, gamma, beta, s, y, st, running_mean, running_var, residual, with_relu,
                                      scratch());
          };
          break;
        }
        case OpKind::batch_norm_backward: {  // [[add +] relu_backward +] batch_norm_backward
          const Node* add = nodes.add >= 0 ? &g.node(nodes.add) : nullptr;
          const T* dy = add ? in(*add, 0) : relu ? in(*relu, 0) : in(n, 0);
          const T* dy_other = add ? in(*add, 1) : nullptr;
          const T* relu_out = relu ? in(*relu, 1) : nullptr;
          const T *x = in(n, 1), *gamma = in(n, 2);
          auto* dx = static_cast<T*>(written(n.outputs[0]));
          auto* dgamma = static_cast<T*>(written(n.outputs[1]));
          auto* dbeta = static_cast<T*>(written(n.outputs[2]));
          run = [=](cudaStream_t st) {
            launch_batch_norm_backward(dy, x, gamma, s, dx, dgamma, dbeta, st, relu_out, dy_other, scratch());
          };
          break;
        }
        case OpKind::batch_norm_stats_update: {
          const T* x = in(n, 0);
          run = [=](cudaStream_t st) {
            launch_batch_norm_stats_update(x, s, running_mean, running_var, st, scratch());
          };
          break;
        }
        default: {
          const T *x = in(n, 0), *gamma = in(n, 1), *beta = in(n, 2);
          const auto* mean = static_cast<const float*>(ptr(n.inputs[3]));
          const auto* var = static_cast<const float*>(ptr(n.inputs[4]));
          auto* y = static_cast<T*>(ptr(n.outputs[0]));
          run = [=](cudaStream_t st) { launch_batch_norm_inference(x, gamma, beta, mean, var, s, y, st); };
          break;
        }
      }
    });
    return std::make_unique<BoundLaunch>(
        std::move(run), fmt::format("{} channels of {} values{}{}", s.channels, s.n * s.plane,
                                    running_mean ? ", running statistics" : "", workspace ? ", rows path" : ""));
  }

 private:
  // Every input has X's type but the running statistics (f32); X is floating.
  static bool types_fit(const sg::Graph& g, const Node& n) {
    const DType t = g.value(n.inputs[0]).dtype;
    if (!is_floating(t)) return false;
    for (std::size_t slot = 0; slot < n.inputs.size(); ++slot)
      if (g.value(n.inputs[slot]).dtype != (running_statistic(n.op, slot) ? DType::f32 : t)) return false;
    return true;
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_batch_norm_lowering() { return std::make_unique<BatchNormLowering>(); }

}  // namespace sg::cuda
