// Lowering: a graph that is exactly a small sequential CNN's training step
// (runtime/plan/cnn_step_pattern.hpp: fp16 or bf16 activations, fp32 master
// weights, SGD with or without Nesterov momentum, or any update rule) as two kernels per step
// (ops/cuda/fast_paths/cnn_step/cnn_step.hpp): every example's forward and
// backward in one block with its activations in shared memory, then the
// summed gradients' updates. A data-parallel rank's step (its gradients
// all-reduced before their updates) keeps both kernels: the second stores the
// gradients, and the all-reduces, the updates and the step advance are the
// update stage's launches (any optimizer). Asks the device (shared memory).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <functional>

#include "runtime/cuda/fast_paths/whole_step/cnn_step.hpp"

#include "ops/cuda/fast_paths/cnn_step/cnn_step.hpp"
#include "ops/cuda/cuda_check.hpp"
#include "runtime/cuda/lowerings/activation_nodes.hpp"
#include "runtime/cuda/lowerings/lowering_support.hpp"
#include "runtime/cuda/lowerings/update_rule_table.hpp"
#include "runtime/plan/cnn_step_pattern.hpp"

namespace sg::cuda {
namespace {

using Kind = CnnStepLayerKind;

// [C, H, W] of one example of a batch-major value; a flat [B, F] is [F, 1, 1].
void example_shape(const Shape& s, int& c, int& h, int& w) {
  c = static_cast<int>(s.size() > 1 ? s[1] : 1);
  h = static_cast<int>(s.size() > 2 ? s[2] : 1);
  w = static_cast<int>(s.size() > 3 ? s[3] : 1);
  for (std::size_t i = 4; i < s.size(); ++i) w *= static_cast<int>(s[i]);
}

CnnLayerOp op_of(Kind k) {
  switch (k) {
    case Kind::conv2d: return CnnLayerOp::conv2d;
    case Kind::max_pool2d: return CnnLayerOp::max_pool2d;
    case Kind::relu: return CnnLayerOp::relu;
    case Kind::activation: return CnnLayerOp::activation;
    case Kind::dropout2d: return CnnLayerOp::dropout2d;
    case Kind::dropout: return CnnLayerOp::dropout;
    case Kind::view: return CnnLayerOp::view;
    case Kind::linear: return CnnLayerOp::linear;
  }
  return CnnLayerOp::view;
}

// The update nodes of a plan's parameters, in tensor order.
std::vector<NodeId> update_nodes(const CnnStepPlan& plan) {
  std::vector<NodeId> nodes;
  for (const CnnStepLayer& p : plan.layers)
    if (p.weight_update >= 0) nodes.insert(nodes.end(), {p.weight_update, p.bias_update});
  return nodes;
}

// Why the update kernel cannot apply the plan's updates ("" when it can):
// it applies one optimizer to every tensor, SGD (momentum, Nesterov, weight
// decay) or an update rule of update_rule_table.hpp without clipping,
// every state fp32 and the step counter the fetch's.
std::string update_blocker(const sg::Graph& g, const CnnStepPlan& plan) {
  const std::vector<NodeId> nodes = update_nodes(plan);
  if (nodes.empty() || plan.gradients_reduced) return {};  // reduced gradients: the update stage applies any optimizer
  const Node& first = g.node(nodes.front());
  for (NodeId id : nodes)
    if (g.node(id).op != first.op || !(g.node(id).attrs == first.attrs))
      return "the parameters' optimizer updates differ (the update kernel applies one to all)";
  for (NodeId id : nodes) {
    const Node& n = g.node(id);
    std::vector<ValueId> states;
    if (n.op == OpKind::sgd_update) {
      if (n.inputs.size() > 2) states.push_back(n.inputs[2]);
      else if (n.attr<SgdUpdateAttrs>().nesterov) return "SGD with Nesterov momentum but no velocity";
    } else if (const std::optional<UpdateInputs> u = update_inputs(n)) {
      if (u->clip_scale >= 0) return "gradient clipping (its scale exists only after every gradient)";
      if (u->step >= 0 && u->step != plan.step) return "the update reads another step counter than the batch fetch";
      for (ValueId v : u->state)
        if (v >= 0) states.push_back(v);
    } else {
      return fmt::format("optimizer update {}: no update rule for it (runtime/cuda/lowerings/update_rule_table.hpp)",
                         op_name(n.op));
    }
    for (ValueId v : states)
      if (g.value(v).dtype != DType::f32) return "the optimizer's state is not fp32";
  }
  return {};
}

// The kernels' sizes for a plan (pointers are bound later); empty `why` when they run it.
CnnStepArgs shape_of(const sg::Graph& g, const CnnStepPlan& plan, std::string& why) {
  CnnStepArgs a;
  a.batch = static_cast<int>(plan.batch);
  a.gradient_scale = static_cast<float>(plan.gradient_scale);
  a.bf16 = g.value(plan.layers.front().input).dtype == DType::bf16;
  const std::vector<NodeId> updates = update_nodes(plan);
  a.nesterov = !updates.empty() && g.node(updates.front()).op == OpKind::sgd_update &&
               g.node(updates.front()).attr<SgdUpdateAttrs>().nesterov;
  a.rows = g.value(plan.perm).shape[0];
  a.rank = static_cast<int>(plan.rank);
  a.ranks = static_cast<int>(plan.ranks);
  a.gradients_out = plan.gradients_reduced;
  a.scale = static_cast<float>(plan.input_scale);
  a.shift = static_cast<float>(plan.input_shift);
  if (plan.layers.size() > std::size_t(kCnnStepMaxLayers)) {
    why = fmt::format("{} layers (at most {})", plan.layers.size(), kCnnStepMaxLayers);
    return a;
  }
  a.layers = static_cast<int>(plan.layers.size());
  std::int64_t offset = 0;
  auto tensor = [&](ValueId param) {
    const int t = a.tensors++;
    if (t < kCnnStepMaxTensors) {
      a.param_offset[t] = offset;
      offset += element_count(g.value(param).shape);
      a.param_offset[t + 1] = offset;
    }
    return t;
  };
  for (std::size_t i = 0; i < plan.layers.size(); ++i) {
    const CnnStepLayer& p = plan.layers[i];
    CnnLayer& L = a.layer[i];
    L.op = op_of(p.kind);
    example_shape(g.value(p.input).shape, L.in_c, L.in_h, L.in_w);
    example_shape(g.value(p.output).shape, L.out_c, L.out_h, L.out_w);
    L.input_gradient = p.input_gradient;
    if (g.value(p.output).dtype != (a.bf16 ? DType::bf16 : DType::f16))
      why = "activations are not all fp16 or all bf16";
    if (p.kind == Kind::conv2d) {
      const Shape& w = g.value(p.weight).shape;
      L.kernel_h = static_cast<int>(w[2]);
      L.kernel_w = static_cast<int>(w[3]);
      L.stride = static_cast<int>(p.conv.stride);
      L.padding = static_cast<int>(p.conv.padding);
    }
    if (p.kind == Kind::max_pool2d) {
      L.kernel_h = L.kernel_w = static_cast<int>(p.pool.kernel);
      L.stride = static_cast<int>(p.pool.stride);
    }
    if (p.kind == Kind::dropout || p.kind == Kind::dropout2d)
      L.dropout = dropout_params_of(p.dropout);
    if (p.kind == Kind::activation) L.activation = *forward_activation(p.activation);
    if (p.kind == Kind::conv2d || p.kind == Kind::linear) {
      L.weight = tensor(p.weight);
      L.bias = tensor(p.bias);
    }
  }
  if (a.tensors > kCnnStepMaxTensors) why = fmt::format("{} parameter tensors (at most {})", a.tensors, kCnnStepMaxTensors);
  const CnnLayer& first = a.layer[0];
  if (g.value(plan.images).shape.size() != 2 || g.value(plan.images).shape[1] != std::int64_t(first.in_c) * first.in_h * first.in_w)
    why = "the image rows are not the first layer's input";
  if (g.value(plan.layers.front().input).dtype != DType::f16 && !a.bf16) why = "activations are not fp16 or bf16";
  if (std::string update = update_blocker(g, plan); !update.empty()) why = update;
  return a;
}

// The plan when the fused step runs `g` under `o`; otherwise none and why not.
// Without `ask_device` the device's shared memory is not asked; `args`, when
// given, gets the kernels' sizes.
std::optional<CnnStepPlan> fused_plan(const sg::Graph& g, const BackendOptions& o, std::string& why,
                                      bool ask_device = true, CnnStepArgs* args = nullptr) {
  if (!o.whole_step) {
    why = "turned off (backend.whole_step: false)";
    return std::nullopt;
  }
  // cudnn / implicit_gemm ask for those per-launch convolutions (tensor_core names the per-launch kernels of
  // channels-last convolutions: the fused step's own stay).
  if (o.conv_kernels == ConvKernels::cudnn || o.conv_kernels == ConvKernels::implicit_gemm) {
    why = "backend.conv_kernels asks for per-launch convolutions";
    return std::nullopt;
  }
  CnnStepMatch found = match_cnn_step(g);
  if (!found.plan) {
    why = "the graph is not a plain CNN training step: " + found.why_not;
    return std::nullopt;
  }
  const CnnStepArgs a = shape_of(g, *found.plan, why);
  if (args) *args = a;
  if (why.empty() && ask_device) why = cnn_step_unsupported(a);
  if (!why.empty()) return std::nullopt;
  return std::move(found.plan);
}

// Both kernels of one step on a stream, the update by the graph's optimizer.
using CnnStepLauncher = std::function<void(const CnnStepArgs&, const CnnStepLaunch&, cudaStream_t, bool dependent)>;

class CnnStepRecord final : public RecordedLaunch {
 public:
  // Owns the parameter image (CnnStepArgs::image) and builds it from the
  // parameters as they are now, on `stream`.
  CnnStepRecord(CnnStepArgs args, CnnStepLaunch launch, CnnStepLauncher launcher, void* const* workspace,
                bool dependent, cudaStream_t stream)
      : args_(args),
        launch_(launch),
        launcher_(std::move(launcher)),
        image_(cnn_step_image_bytes(launch)),
        index_tables_(std::size_t(launch.tables_floats) * sizeof(float)),
        workspace_(workspace),
        dependent_(dependent) {
    const std::vector<int2> tables = cnn_step_index_tables(args_, launch_);
    index_tables_.upload(tables.data(), tables.size() * sizeof(int2));
    args_.index_tables = index_tables_.as<const float>();
    args_.image = image_.as<float>();
    launch_cnn_step_image(args_, launch_, stream);
  }
  void enqueue(cudaStream_t s) const override { launcher_(with_workspace(), launch_, s, dependent_); }
  void parameters_written(cudaStream_t s) const override { launch_cnn_step_image(args_, launch_, s); }
  std::string label() const override {
    return fmt::format("{} blocks of {} threads, one example each at a time, {} KB shared; then {}", launch_.blocks,
                       launch_.threads, launch_.shared_bytes / 1024,
                       args_.gradients_out ? "the summed gradients, which the update stage reduces and applies"
                                           : "the updates");
  }
  // Median GPU-clock time of each phase of block 0's first example over `repeats` steps.
  std::vector<std::pair<std::string, double>> profile_phases(int repeats, cudaStream_t stream) const override {
    return median_phase_times(cnn_step_phase_names(args_), repeats, stream, [&](unsigned long long* clock) {
      CnnStepArgs a = with_workspace();
      a.phase_clock = clock;
      launcher_(a, launch_, stream, dependent_);
    });
  }

 private:
  CnnStepArgs with_workspace() const {
    CnnStepArgs a = args_;
    a.workspace = static_cast<float*>(*workspace_);
    return a;
  }

  CnnStepArgs args_;
  CnnStepLaunch launch_;
  CnnStepLauncher launcher_;
  DeviceBuffer image_;
  DeviceBuffer index_tables_;  // cnn_step_index_tables
  void* const* workspace_;
  bool dependent_;
};

std::string layer_text(const sg::Graph& g, const CnnStepLayer& l) {
  switch (l.kind) {
    case Kind::conv2d: {
      const Shape& w = g.value(l.weight).shape;
      return fmt::format("conv{}x{}:{}->{}/s{}p{}", w[2], w[3], w[1], w[0], l.conv.stride, l.conv.padding);
    }
    case Kind::max_pool2d: return fmt::format("maxpool{}/s{}", l.pool.kernel, l.pool.stride);
    case Kind::relu: return "relu";
    case Kind::activation: return std::string(op_name(l.activation));
    case Kind::dropout2d: return fmt::format("dropout2d({})", l.dropout.p);
    case Kind::dropout: return fmt::format("dropout({})", l.dropout.p);
    case Kind::view: return "view";
    case Kind::linear: {
      const Shape& w = g.value(l.weight).shape;
      return fmt::format("linear:{}->{}", w[1], w[0]);
    }
  }
  return "?";
}

class CnnStepLowering final : public CudaLowering {
 public:
  explicit CnnStepLowering(const BackendOptions& options) : options_(options) {}
  std::string_view name() const override { return "cnn_step"; }
  bool covers_whole_step() const override { return true; }
  bool asks_device() const override { return true; }
  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    if (unit.id != 0) return std::nullopt;
    std::string why;
    std::optional<CnnStepPlan> plan = fused_plan(cover.graph(), options_, why);
    if (!plan) return std::nullopt;
    Match m;
    // Reduced gradients: the all-reduces, updates and step advance are the update stage's launches.
    const sg::Graph& g = cover.graph();
    const auto update_stage = [&](NodeId n) {
      const OpKind op = g.node(n).op;
      return op == OpKind::all_reduce_mean || op_updates_in_place(op) || op == OpKind::advance_step;
    };
    for (const CoverUnit& u : cover.units()) {
      const auto staged = std::count_if(u.nodes.begin(), u.nodes.end(), update_stage);
      if (!plan->gradients_reduced || staged == 0) {
        m.units.push_back(u.id);
        continue;
      }
      if (staged != static_cast<std::ptrdiff_t>(u.nodes.size())) return std::nullopt;  // a fusion across the boundary
    }
    m.graph_order = true;
    m.detail = std::move(*plan);
    return m;
  }
  std::string describe(const sg::Graph& g, const Launch& l) const override {
    const auto& plan = detail_of<CnnStepPlan>(l);
    std::vector<std::string> layers;
    for (const CnnStepLayer& layer : plan.layers) layers.push_back(layer_text(g, layer));
    // An update rule the kernels apply is named; SGD, which they were first
    // written for, is not, nor the update stage's (its own launches say).
    const std::vector<NodeId> updates = update_nodes(plan);
    const std::string update =
        updates.empty() || plan.gradients_reduced || g.node(updates.front()).op == OpKind::sgd_update
            ? std::string()
            : ",update=" + update_rule_name(g.node(updates.front()));
    const std::string shard =
        plan.gradients_reduced ? fmt::format(",rank={}/{},gradients out", plan.rank, plan.ranks) : std::string();
    return fmt::format("layers={},batch={}{}{}", fmt::join(layers, ","), plan.batch, update, shard);
  }
  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto& plan = detail_of<CnnStepPlan>(l);
    std::string why;
    CnnStepArgs a = shape_of(g, plan, why);
    if (!why.empty()) throw CudaError("cnn_step: " + why);
    // Tensor t is the t-th update node (shape_of numbers them in the same order).
    const std::vector<NodeId> updates = update_nodes(plan);
    CnnStepRuleState state;
    std::vector<ValueId> gradients;  // in the same order
    for (const CnnStepLayer& p : plan.layers)
      if (p.weight_update >= 0) gradients.insert(gradients.end(), {p.weight_gradient, p.bias_gradient});
    for (std::size_t t = 0; t < updates.size(); ++t) {
      const Node& n = g.node(updates[t]);
      a.param[t] = static_cast<float*>(c.ptr(n.inputs[0]));
      a.scalars[t] = c.update_scalars(n.id);
      if (a.gradients_out) {
        a.gradient_out[t] = static_cast<float*>(c.ptr(gradients[t]));
        continue;  // the update stage holds the optimizer's state
      }
      if (n.op == OpKind::sgd_update)
        a.velocity[t] = n.inputs.size() > 2 ? static_cast<float*>(c.ptr(n.inputs[2])) : nullptr;
      else
        state.tensor[t] = state_slots(*update_inputs(n), [&](ValueId v) { return c.ptr(v); });
    }
    CnnStepLauncher launcher = [](const CnnStepArgs& args, const CnnStepLaunch& launch, cudaStream_t s, bool dep) {
      launch_cnn_step(args, launch, s, dep);
    };
    if (a.gradients_out)
      launcher = [](const CnnStepArgs& args, const CnnStepLaunch& launch, cudaStream_t s, bool dep) {
        launch_cnn_step_gradients(args, launch, s, dep);
      };
    else if (!updates.empty())
      with_update_rule(g.node(updates.front()), [&](auto rule, auto hyper) {
        using Rule = typename decltype(rule)::type;
        launcher = [state, hyper](const CnnStepArgs& args, const CnnStepLaunch& launch, cudaStream_t s, bool dep) {
          launch_cnn_step<Rule>(args, launch, state, hyper, s, dep);
        };
      });
    a.perm = static_cast<const std::int32_t*>(c.ptr(plan.perm));
    a.step = static_cast<std::int32_t*>(c.ptr(plan.step));
    a.images = static_cast<const std::uint8_t*>(c.ptr(plan.images));
    a.labels = static_cast<const std::uint8_t*>(c.ptr(plan.labels));
    a.loss = static_cast<float*>(c.ptr(plan.loss));
    const CnnStepLaunch launch = plan_cnn_step_launch(a);
    return std::make_unique<CnnStepRecord>(a, launch, std::move(launcher), c.workspace(cnn_step_workspace_bytes(a, launch)),
                                           c.options().dependent_launch, c.stream());
  }

 private:
  BackendOptions options_;
};

}  // namespace

std::string cnn_step_blocker(const sg::Graph& graph, const BackendOptions& options) {
  std::string why;
  fused_plan(graph, options, why);
  return why;
}

std::string cnn_step_structural_blocker(const sg::Graph& graph, const BackendOptions& options, CnnStepFit* fit) {
  std::string why;
  CnnStepArgs a;
  fused_plan(graph, options, why, /*ask_device=*/false, &a);
  if (fit && why.empty()) *fit = {a.bf16, cnn_step_shared_bytes(a)};
  return why;
}

std::unique_ptr<CudaLowering> make_cnn_step_lowering(const BackendOptions& options) {
  return std::make_unique<CnnStepLowering>(options);
}

}  // namespace sg::cuda
