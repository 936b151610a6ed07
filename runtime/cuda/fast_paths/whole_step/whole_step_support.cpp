#include "runtime/cuda/fast_paths/whole_step/whole_step_support.hpp"

#include <algorithm>

#include <fmt/ranges.h>

#include "ops/cuda/fast_paths/whole_step/resident_step.hpp"
#include "ops/cuda/fast_paths/measured_costs.hpp"
#include "runtime/cuda/lowerings/activation_nodes.hpp"
#include "runtime/cuda/lowerings/update_rule_table.hpp"

namespace sg::cuda {
namespace {

// Where the whole-step kernels beat the per-launch schedule: measured_costs.hpp.
using measured::kResidentStepMaxParameters;
using measured::kWholeStepMaxParameters;

bool per_launch_faster_batch(std::int64_t batch) {
  for (std::int64_t b : measured::kPerLaunchFasterBatches)
    if (b == batch) return true;
  return false;
}

WholeStepChoice choice_of(const BackendOptions& o) {
  WholeStepChoice c;
  switch (o.whole_step_mode) {
    case WholeStepMode::automatic: c.variant = WholeStepVariant::automatic; break;
    case WholeStepMode::grid: c.variant = WholeStepVariant::grid; break;
    case WholeStepMode::cluster: c.variant = WholeStepVariant::cluster; break;
    case WholeStepMode::resident: c.variant = WholeStepVariant::resident; break;
  }
  c.resident_cluster = o.resident_cluster;
  return c;
}

// Whether the plan's updates leave the kernel (WholeStepArgs::gradients_out):
// they are an update rule's (update_blocker says they are all alike).
bool updates_by_rule(const sg::Graph& g, const WholeStepPlan& plan) {
  return !plan.layers.empty() && is_update_rule_op(g.node(plan.layers.front().weight_update).op);
}

// Why the kernels can neither apply nor hand over the plan's updates ("" when
// they can): plain SGD is applied in-kernel; update rules (no clipping: its
// scale needs every gradient first) run in the update stage's launch after
// the kernel, which takes the gradients the kernel stores.
std::string update_blocker(const sg::Graph& g, const WholeStepPlan& plan) {
  bool sgd = false, rule = false;
  for (const WholeStepLayer& layer : plan.layers)
    for (NodeId id : {layer.weight_update, layer.bias_update}) {
      const Node& n = g.node(id);
      if (n.op == OpKind::sgd_update) {
        sgd = true;
        if (n.inputs.size() != 2 || n.attr<SgdUpdateAttrs>().momentum != 0.0)
          return "SGD with momentum: the kernels apply plain SGD in-kernel";
      } else if (const std::optional<UpdateInputs> u = update_inputs(n)) {
        rule = true;
        if (u->clip_scale >= 0) return "gradient clipping (its scale exists only after every gradient)";
      } else {
        return fmt::format("optimizer update {}: no update rule for it (runtime/cuda/lowerings/update_rule_table.hpp)",
                           op_name(n.op));
      }
    }
  if (sgd && rule) return "SGD and an update rule in one step";
  return {};
}

// The sizes of a whole-step launch (pointers are bound later).
WholeStepArgs shape_of(const sg::Graph& g, const WholeStepPlan& plan) {
  WholeStepArgs args;
  args.layers = static_cast<int>(plan.layers.size());
  args.batch = static_cast<int>(plan.batch);
  for (std::size_t i = 0; i < plan.dims.size() && i <= std::size_t(kWholeStepMaxLayers); ++i)
    args.dims[i] = static_cast<int>(plan.dims[i]);
  args.rows = g.value(plan.perm).shape[0];
  args.scale = float(plan.input_scale);
  args.shift = float(plan.input_shift);
  args.activation = forward_activation(plan.activation).value_or(Activation::relu);
  args.gradients_out = updates_by_rule(g, plan);
  return args;
}

class WholeStepRecord final : public RecordedLaunch {
 public:
  WholeStepRecord(WholeStepArgs args, WholeStepLaunch launch) : args_(args), launch_(launch) {}
  void enqueue(cudaStream_t s) const override { launch_whole_step(args_, launch_, s); }
  bool enqueue_steps(cudaStream_t s, int steps) const override {
    if (!launch_.resident) return false;
    launch_whole_step(args_, launch_, s, steps);
    return true;
  }
  std::string label() const override {
    return fmt::format("{} blocks as {}", launch_.blocks,
                       launch_.resident  ? "one cluster, weights resident in shared memory"
                       : launch_.cluster ? "one cluster"
                                         : "a cooperative grid");
  }
  std::vector<std::pair<std::string, double>> profile_phases(int repeats, cudaStream_t stream) const override {
    return median_phase_times(whole_step_phase_names(args_, launch_), repeats, stream, [&](unsigned long long* clock) {
      WholeStepArgs args = args_;
      args.phase_clock = clock;
      launch_whole_step(args, launch_, stream);
    });
  }

 private:
  WholeStepArgs args_;
  WholeStepLaunch launch_;
};

}  // namespace

std::string whole_step_blocker(const sg::Graph& g, const BackendOptions& o, bool resident) {
  if (!o.whole_step) return "turned off";
  const auto plan = match_whole_step(g);
  if (!plan) return "the graph is not a plain MLP training step";
  const auto activation = forward_activation(plan->activation);
  if (!activation) return fmt::format("activation {}", op_name(plan->activation));
  if (backward_reads_input(*activation) != plan->backward_reads_pre_activation)
    return fmt::format("{}'s backward reads another value than the kernels keep", op_name(plan->activation));
  for (const WholeStepLayer& layer : plan->layers) {
    if (g.value(layer.weight).dtype != DType::f16 || g.value(layer.output).dtype != DType::f16 ||
        (layer.pre_activation >= 0 && g.value(layer.pre_activation).dtype != DType::f16))
      return "parameters or activations are not fp16";
  }
  if (std::string why = update_blocker(g, *plan); !why.empty()) return why;
  if (plan->layers.size() > std::size_t(kWholeStepMaxLayers)) return "too many layers";
  const WholeStepArgs shape = shape_of(g, *plan);
  if (std::string why = whole_step_unsupported(shape); !why.empty()) return why;
  const bool automatic = o.whole_step_mode == WholeStepMode::automatic;
  // (The one-pass kernels that make the per-launch schedule faster at some
  // batches apply plain SGD only: with an update rule they are not there.)
  const bool per_launch_kernels = o.one_pass_backward && !o.accumulate_f16 && !shape.gradients_out;
  if (automatic && per_launch_kernels && per_launch_faster_batch(plan->batch))
    return fmt::format("batch {}: the per-launch schedule's dependent-launch kernels are faster", plan->batch);
  std::int64_t parameters = 0;
  for (const WholeStepLayer& layer : plan->layers)
    parameters += element_count(g.value(layer.weight).shape) + element_count(g.value(layer.bias).shape);
  const bool resident_pays = o.whole_step_mode == WholeStepMode::resident ||
                             (automatic && o.steps_per_launch > 1 && parameters <= kResidentStepMaxParameters);
  const std::string resident_why = resident_pays ? resident_step_unsupported(shape, o.resident_cluster) : "not asked for";
  if (resident) return resident_why.empty() ? "" : "resident weights: " + resident_why;
  if (resident_why.empty()) return "the resident-weights kernel takes it";
  if (automatic && parameters > kWholeStepMaxParameters)
    return fmt::format("{} parameters: above {} the per-launch schedule is faster", parameters, kWholeStepMaxParameters);
  return {};
}

namespace {

std::optional<Match> match_whole_graph(const Cover& cover, const CoverUnit& unit, const BackendOptions& options,
                                       bool resident) {
  const sg::Graph& g = cover.graph();
  if (unit.id != 0 || !whole_step_blocker(g, options, resident).empty()) return std::nullopt;
  const WholeStepPlan plan = *match_whole_step(g);
  Match m;
  // With an update rule the updates and the step advance are left to the
  // update stage's launch (update_multi_tensor), which reads the gradients
  // the kernel stores; else the kernel takes every node.
  const bool gradients_out = updates_by_rule(g, plan);
  for (const CoverUnit& u : cover.units()) {
    const Node& n = g.node(u.nodes.front());
    if (gradients_out && u.nodes.size() == 1 && (is_update_rule_op(n.op) || n.op == OpKind::advance_step)) continue;
    m.units.push_back(u.id);
  }
  m.graph_order = true;
  for (const WholeStepLayer& layer : plan.layers)  // hidden layers; the logits stay on chip
    if (layer.pre_activation_grad >= 0) {
      m.scratch.push_back(layer.output);
      m.scratch.push_back(layer.pre_activation_grad);
      // gelu, gelu_tanh, silu: the backward reads the pre-activation the forward keeps
      if (plan.backward_reads_pre_activation) m.scratch.push_back(layer.pre_activation);
    }
  m.detail = plan;
  return m;
}

std::unique_ptr<RecordedLaunch> record_whole_step(const Launch& l, const BindContext& c, bool resident) {
  const sg::Graph& g = c.graph();
  const auto& plan = detail_of<WholeStepPlan>(l);
  WholeStepArgs args = shape_of(g, plan);
  for (std::size_t i = 0; i < plan.layers.size(); ++i) {
    const WholeStepLayer& layer = plan.layers[i];
    args.weight[i] = static_cast<__half*>(c.ptr(layer.weight));
    args.bias[i] = static_cast<__half*>(c.ptr(layer.bias));
    // (Bound with gradients out too: the kernels load them before they branch.)
    args.weight_sgd[i] = c.update_scalars(layer.weight_update);
    args.bias_sgd[i] = c.update_scalars(layer.bias_update);
    if (args.gradients_out) {  // the gradient values the update nodes read
      args.weight_grad[i] = static_cast<__half*>(c.ptr(g.node(layer.weight_update).inputs[1]));
      args.bias_grad[i] = static_cast<__half*>(c.ptr(g.node(layer.bias_update).inputs[1]));
    }
    if (layer.pre_activation_grad >= 0) {  // a hidden layer (the logits never leave the chip)
      args.act[i] = static_cast<__half*>(c.ptr(layer.output));
      args.grad[i] = static_cast<__half*>(c.ptr(layer.pre_activation_grad));
      if (plan.backward_reads_pre_activation) args.pre[i] = static_cast<__half*>(c.ptr(layer.pre_activation));
    }
  }
  args.perm = static_cast<const std::int32_t*>(c.ptr(plan.perm));
  args.step = static_cast<std::int32_t*>(c.ptr(plan.step));
  args.images = static_cast<const std::uint8_t*>(c.ptr(plan.images));
  args.labels = static_cast<const std::uint8_t*>(c.ptr(plan.labels));
  args.loss = static_cast<float*>(c.ptr(plan.loss));
  WholeStepChoice choice = choice_of(c.options());
  if (resident) choice.variant = WholeStepVariant::resident;
  else if (choice.variant == WholeStepVariant::resident) choice.variant = WholeStepVariant::grid;
  const int steps = resident ? static_cast<int>(std::max<std::int64_t>(2, c.options().steps_per_launch)) : 1;
  const WholeStepLaunch launch = plan_whole_step_launch(args, steps, choice);
  if (launch.resident != resident)
    throw CudaError(fmt::format("whole step: planned {} the resident-weights kernel", resident ? "without" : "with"));
  return std::make_unique<WholeStepRecord>(args, launch);
}

class WholeGraphLowering final : public CudaLowering {
 public:
  WholeGraphLowering(std::string_view name, const BackendOptions& options, bool resident)
      : name_(name), options_(options), resident_(resident) {}
  std::string_view name() const override { return name_; }
  bool covers_whole_step() const override { return true; }
  bool asks_device() const override { return true; }
  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    return match_whole_graph(cover, unit, options_, resident_);
  }
  std::string describe(const sg::Graph& g, const Launch& l) const override {
    const auto& plan = detail_of<WholeStepPlan>(l);
    const std::string activation =  // (ReLU steps print as they always did)
        plan.activation == OpKind::relu ? "" : fmt::format(",activation={}", op_name(plan.activation));
    const std::string gradients =  // (and SGD steps too)
        updates_by_rule(g, plan) ? ",gradients out for " + update_rule_name(g.node(plan.layers.front().weight_update))
                                 : "";
    return fmt::format("dims={},batch={}{}{}", fmt::join(plan.dims, "-"), plan.batch, activation, gradients);
  }
  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    return record_whole_step(l, c, resident_);
  }

 private:
  std::string name_;
  BackendOptions options_;
  bool resident_;
};

}  // namespace

std::unique_ptr<CudaLowering> make_whole_graph_lowering(std::string_view name, const BackendOptions& options,
                                                        bool resident) {
  return std::make_unique<WholeGraphLowering>(name, options, resident);
}

}  // namespace sg::cuda
