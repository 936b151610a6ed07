#include "runtime/cuda/cuda_program.hpp"

#include <algorithm>
#include <cstddef>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/dgrad_wgrad.hpp"
#include "ops/cuda/env_switch.hpp"
#include "ops/cuda/output_layer_backward.hpp"
#include "ops/cuda/resident_step.hpp"
#include "ops/cuda/small_batch_forward.hpp"
#include "ops/cuda/small_linear.hpp"
#include "ops/cuda/whole_step.hpp"
#include "runtime/plan/whole_step_match.hpp"

namespace sg::cuda {
namespace {

// alpha/beta values every plain matmul reads (pointer mode is device).
struct MatmulConstants {
  float one = 1.0f;
  float zero = 0.0f;
  __half one_h;
  __half zero_h;
};

template <typename F>
void with_float_type(DType dtype, F&& f) {
  if (dtype == DType::f16) f(__half{});
  else if (dtype == DType::f32) f(float{});
  else throw CudaError(fmt::format("cuda backend: {} is not a floating dtype", dtype_name(dtype)));
}

ElemType elem_type(DType dtype) {
  if (dtype == DType::f16) return ElemType::f16;
  if (dtype == DType::f32) return ElemType::f32;
  throw CudaError(fmt::format("cuda backend: matmul operand of dtype {}", dtype_name(dtype)));
}

Epilogue lt_epilogue(MatmulEpilogue e) {
  switch (e) {
    case MatmulEpilogue::none: return Epilogue::none;
    case MatmulEpilogue::bias: return Epilogue::bias;
    case MatmulEpilogue::relu_bias: return Epilogue::relu_bias;
    case MatmulEpilogue::relu_aux_bias: return Epilogue::relu_aux_bias;
    case MatmulEpilogue::drelu: return Epilogue::drelu;
  }
  return Epilogue::none;
}

std::size_t value_bytes(const Value& v) { return static_cast<std::size_t>(element_count(v.shape)) * dtype_size(v.dtype); }

// The sizes of a whole-step launch (pointers are bound later).
WholeStepArgs whole_step_shape(const sg::Graph& g, const WholeStepPlan& plan) {
  WholeStepArgs args;
  args.layers = static_cast<int>(plan.layers.size());
  args.batch = static_cast<int>(plan.batch);
  for (std::size_t i = 0; i < plan.dims.size() && i <= std::size_t(kWholeStepMaxLayers); ++i)
    args.dims[i] = static_cast<int>(plan.dims[i]);
  args.rows = g.value(plan.perm).shape[0];
  args.scale = float(plan.input_scale);
  args.shift = float(plan.input_shift);
  return args;
}

// Where the whole-step kernels beat the per-group schedule on an H100
// (784-H-H-H-10, us per step). At batch 16/32 the per-group schedule runs
// our dependent-launch kernels, and since they keep their loads off the
// critical path it is faster at every width measured, one or 16 steps per
// launch (docs/performance.md section 18: width 64 20.1 against 27.1 for the
// whole-step kernel, 16 steps per launch 18.8 against 22.5 resident; width
// 128 19.9 against 23.4 resident). Other batches (48, 64) keep the earlier
// rule, measured against the two-pass per-group schedule they still take:
// the whole-step kernel up to 64K parameters at one step per launch, the
// resident-weights variant up to 256K for several.
constexpr std::int64_t kWholeStepMaxParameters = std::int64_t(1) << 16;
constexpr std::int64_t kResidentMaxParameters = std::int64_t(1) << 18;

// Why the kernel should not run this plan ("" when it should): it keeps fp16
// parameters and activations, implements SGD without momentum, and pays off
// for small networks whose batch our per-group kernels do not take
// (`per_group_kernels`: ProgramOptions::one_pass_backward). SG_WHOLE_STEP_MODE
// other than auto forces it wherever it fits.
std::string whole_step_blocker(const sg::Graph& g, const WholeStepPlan& plan, int steps_per_launch,
                               bool per_group_kernels) {
  for (const WholeStepLayer& layer : plan.layers) {
    if (g.value(layer.weight).dtype != DType::f16 || g.value(layer.output).dtype != DType::f16)
      return "parameters or activations are not fp16";
    if (g.node(layer.weight_sgd).attrs.momentum != 0.0) return "SGD with momentum";
  }
  if (plan.layers.size() > std::size_t(kWholeStepMaxLayers)) return "too many layers";
  const WholeStepArgs shape = whole_step_shape(g, plan);
  if (std::string why = whole_step_unsupported(shape); !why.empty()) return why;
  const std::string mode = forced_whole_step_mode();
  if (mode == "auto" && per_group_kernels && (plan.batch == 16 || plan.batch == 32))
    return fmt::format("batch {}: the per-group schedule's dependent-launch kernels are faster", plan.batch);
  std::int64_t parameters = 0;
  for (const WholeStepLayer& layer : plan.layers)
    parameters += element_count(g.value(layer.weight).shape) + element_count(g.value(layer.bias).shape);
  const bool resident_pays = mode == "resident" || (mode == "auto" && steps_per_launch > 1 &&
                                                    parameters <= kResidentMaxParameters);
  if (resident_pays && resident_step_unsupported(shape).empty()) return {};
  if (mode == "auto" && parameters > kWholeStepMaxParameters)
    return fmt::format("{} parameters: above {} the per-group schedule is faster", parameters, kWholeStepMaxParameters);
  return {};
}

// Whether the one-pass dgrad + SGD kernel takes this layer's pair of matmuls.
bool one_pass_backward_fits(const sg::Graph& g, NodeId dgrad, NodeId /*wgrad*/) {
  const Node& mm = g.node(dgrad);
  const Value& dy = g.value(mm.inputs[0]);
  const Value& w = g.value(mm.inputs[1]);
  if (mm.attrs.trans_a || mm.attrs.trans_b || dy.dtype != DType::f16 || w.dtype != DType::f16 || w.role != Role::param)
    return false;
  return dgrad_wgrad_unsupported(dy.shape[0], w.shape[0], w.shape[1]).empty();
}

// Whether the fused output-layer backward takes this softmax-xent and dgrad:
// fp16 logits, weight and ReLU output, a small batch and few classes.
bool output_layer_backward_fits(const sg::Graph& g, NodeId xent_backward, NodeId dgrad) {
  const Node& mm = g.node(dgrad);
  const Value& dlogits = g.value(g.node(xent_backward).outputs[0]);
  const Value& w = g.value(mm.inputs[1]);
  if (mm.attrs.trans_a || mm.attrs.trans_b || dlogits.dtype != DType::f16 || w.dtype != DType::f16 ||
      w.role != Role::param || mm.inputs[0] != dlogits.id)
    return false;
  return output_layer_backward_unsupported(dlogits.shape[0], w.shape[0], w.shape[1]).empty();
}

// The lowerings below unless an environment switch turns them off (the
// benchmark's same-run baselines). Read once per process.
bool small_batch_forward_enabled() {
  static const bool enabled = !switched_off("SG_SMALL_BATCH_FORWARD");
  return enabled;
}
bool input_update_fold_enabled() {
  static const bool enabled = !switched_off("SG_FOLD_INPUT_UPDATE");
  return enabled;
}

// Up to how many output columns our small-batch forward beats cuBLASLt
// inside the step (H100, batch 32, docs/performance.md section 16: width
// 1024 37.1 against 37.2 us per step, 2048 56.5 against 55.5).
constexpr std::int64_t kSmallBatchForwardMaxN = 1024;

// A forward matmul our small-batch kernel takes: x[B,K] w[N,K]^T + bias,
// optionally ReLU, all fp16 with fp32 accumulation, B 16 or 32, N up to
// kSmallBatchForwardMaxN.
bool small_batch_forward_fits(const MatmulShape& s) {
  return small_batch_forward_enabled() && s.n <= kSmallBatchForwardMaxN && s.ab_type == ElemType::f16 &&
         s.cd_type == ElemType::f16 &&
         s.accumulate == Accumulate::f32 && !s.trans_a && s.trans_b &&
         (s.epilogue == Epilogue::relu_bias || s.epilogue == Epilogue::bias) &&
         small_batch_linear_unsupported(s.m, s.n, s.k).empty();
}

// A matmul node's operand sizes, transposes and input type (the caller
// sets the output type, accumulation and epilogue).
MatmulShape operand_shape(const sg::Graph& g, const Node& mm) {
  const Value& a = g.value(mm.inputs[0]);
  const Value& b = g.value(mm.inputs[1]);
  MatmulShape s;
  s.trans_a = mm.attrs.trans_a;
  s.trans_b = mm.attrs.trans_b;
  s.m = s.trans_a ? a.shape[1] : a.shape[0];
  s.k = s.trans_a ? a.shape[0] : a.shape[1];
  s.n = s.trans_b ? b.shape[0] : b.shape[1];
  s.ab_type = elem_type(a.dtype);
  return s;
}

// The shape of a forward matmul node (fp32 accumulation).
MatmulShape forward_shape(const sg::Graph& g, NodeId matmul, Epilogue epilogue, DType out) {
  MatmulShape s = operand_shape(g, g.node(matmul));
  s.cd_type = out == DType::f16 ? ElemType::f16 : ElemType::f32;
  s.accumulate = Accumulate::f32;
  s.epilogue = epilogue;
  return s;
}

// Whether the batch fetch can ride on this forward matmul (the first
// layer's): our small-batch kernel takes it, with u8 image and label tables.
bool fetch_fold_fits(const sg::Graph& g, NodeId matmul) {
  const Node& mm = g.node(matmul);
  const NodeId producer = g.value(mm.inputs[0]).producer;
  if (producer < 0) return false;
  const Node& gather = g.node(producer);
  if (gather.op != OpKind::gather_rows || g.value(gather.inputs[0]).dtype != DType::u8) return false;
  const auto& consumers = g.consumers(mm.outputs[0]);
  if (consumers.size() != 1 || g.node(consumers[0]).op != OpKind::bias_add) return false;
  const Node& bias_add = g.node(consumers[0]);
  const auto& after_bias = g.consumers(bias_add.outputs[0]);
  const bool relu = after_bias.size() == 1 && g.node(after_bias[0]).op == OpKind::relu;
  const DType out = relu ? g.value(g.node(after_bias[0]).outputs[0]).dtype : g.value(bias_add.outputs[0]).dtype;
  return small_batch_forward_fits(forward_shape(g, matmul, relu ? Epilogue::relu_bias : Epilogue::bias, out));
}

// Whether the one-pass launch of `dgrad`'s layer can take the first layer's
// update (`input_wgrad`: dX^T X_in into W_in, plain SGD, fp16).
bool input_update_fits(const sg::Graph& g, NodeId dgrad, NodeId input_wgrad) {
  if (!input_update_fold_enabled()) return false;
  const Value& dy = g.value(g.node(dgrad).inputs[0]);
  const Value& w = g.value(g.node(dgrad).inputs[1]);
  const Node& wgrad = g.node(input_wgrad);
  const Value& x_in = g.value(wgrad.inputs[1]);
  const auto& consumers = g.consumers(wgrad.outputs[0]);
  if (!wgrad.attrs.trans_a || wgrad.attrs.trans_b || x_in.dtype != DType::f16 || consumers.size() != 1) return false;
  const Value& w_in = g.value(g.node(consumers[0]).inputs[0]);
  if (w_in.dtype != DType::f16 || w_in.shape[0] != w.shape[1] || w_in.shape[1] != x_in.shape[1]) return false;
  return input_update_unsupported(dy.shape[0], w.shape[0], w.shape[1], x_in.shape[1]).empty();
}

// Who computes a matmul launch: cuBLASLt, or one of our kernels: for the
// classifier layer's tiny dimension, and the small-batch forward (fp32
// accumulation only, like cuBLASLt's).
enum class MatmulImpl : std::uint8_t {
  cublaslt, small_n_forward, small_m_wgrad_sgd, small_k_dgrad_relu, small_batch_forward
};

// `ours`: ProgramOptions::one_pass_backward (our fused kernels, forwards included).
MatmulImpl pick_matmul_impl(const MatmulShape& s, const Launch& l, bool ours) {
  const MatmulTarget target = l.target;
  // The schedule chose a value mask for this dgrad: only our kernel reads one.
  if (l.mask_from_relu_output) return MatmulImpl::small_k_dgrad_relu;
  // The schedule folded the batch fetch into this launch: only our kernel does that.
  if (l.fetches_batch) return MatmulImpl::small_batch_forward;
  if (s.ab_type != ElemType::f16 || s.accumulate != Accumulate::f32) return MatmulImpl::cublaslt;
  if (target == MatmulTarget::output && s.epilogue == Epilogue::bias && !s.trans_a && s.trans_b &&
      s.cd_type == ElemType::f16 && s.n <= kSmallLinearMaxDim)
    return MatmulImpl::small_n_forward;
  if (ours && target == MatmulTarget::output && small_batch_forward_fits(s)) return MatmulImpl::small_batch_forward;
  // (k is the batch here: each thread sums over it, so only small batches)
  if (target == MatmulTarget::param_sgd && s.epilogue == Epilogue::none && s.trans_a && !s.trans_b &&
      s.m <= kSmallLinearMaxDim && s.k <= 64)
    return MatmulImpl::small_m_wgrad_sgd;
  return MatmulImpl::cublaslt;
}

}  // namespace

struct CudaProgram::Bound {
  MatmulImpl impl = MatmulImpl::cublaslt;
  MatmulShape shape;
  const SgdScalars* sgd = nullptr;
  const void* relu_out = nullptr;  // small_k_dgrad_relu's mask source
  std::unique_ptr<LtMatmul> matmul;
  std::unique_ptr<WholeStepArgs> whole_step;
  std::unique_ptr<DgradWgradSgd> dgrad_wgrad;
  one_pass::InputLayerUpdate input_update;  // dgrad_wgrad_sgd with the first layer's update folded in
  SmallBatchLinear forward;                 // small_batch_forward
  OutputLayerBackward output_backward;
  // dgrad_wgrad_sgd: d = dx, a = dy, b = x (the relu output), w below
  void* w = nullptr;
  void* prev_bias = nullptr;             // the previous layer's bias, updated by the same launch
  const SgdScalars* prev_bias_sgd = nullptr;
  WholeStepLaunch whole_step_launch;
  const void *a = nullptr, *b = nullptr, *c = nullptr, *alpha = nullptr, *beta = nullptr, *bias = nullptr;
  void *d = nullptr, *aux = nullptr;
};

CudaProgram::CudaProgram(sg::Graph graph, DeviceValues& params, const LtHandle& lt, ProgramOptions options,
                         cudaStream_t stream)
    : graph_(std::move(graph)), options_(options), params_(params) {
  schedule_ = choose_schedule();
  std::vector<std::size_t> bytes;
  for (const Value& v : graph_.values()) bytes.push_back(value_bytes(v));
  std::vector<std::size_t> mask_bytes;
  for (const AuxBuffer& aux : schedule_.aux) mask_bytes.push_back(relu_aux_bytes(aux.rows, aux.cols));
  auto request = arena_request(graph_, schedule_, bytes, mask_bytes);
  buffer_of_value_ = std::move(request.buffer_of_value);
  buffer_of_mask_ = std::move(request.buffer_of_mask);
  plan_ = plan_memory(std::move(request.buffers));
  arena_ = DeviceBuffer(plan_.arena_bytes);

  for (const Value& v : graph_.values()) {
    void* ptr = nullptr;
    if (v.role == Role::param) ptr = params_.get_or_create(v).data();
    else if (is_graph_owned(v.role)) ptr = own_.get_or_create(v).data();
    else if (int slot = buffer_of_value_[static_cast<std::size_t>(v.id)]; slot >= 0)
      ptr = arena_.as<char>() + plan_.slots[static_cast<std::size_t>(slot)].offset;
    value_ptr_.push_back(ptr);
  }

  std::vector<SgdScalars> scalars;
  for (const Node& n : graph_.nodes())
    if (n.op == OpKind::sgd_update) {
      sgd_nodes_.push_back(n.id);
      scalars.push_back(make_sgd_scalars(float(n.attrs.lr), float(n.attrs.momentum), float(n.attrs.weight_decay)));
    }
  sgd_scalars_ = DeviceBuffer(std::max<std::size_t>(1, scalars.size()) * sizeof(SgdScalars));
  if (!scalars.empty()) sgd_scalars_.upload(scalars.data(), scalars.size() * sizeof(SgdScalars));
  uploader_ = std::make_unique<ScalarUploader>(std::max<std::size_t>(1, scalars.size()) * sizeof(SgdScalars));

  MatmulConstants constants;
  constants.one_h = __float2half(1.0f);
  constants.zero_h = __float2half(0.0f);
  constants_ = DeviceBuffer(sizeof constants);
  constants_.upload(&constants, sizeof constants);
  scratch_loss_ = DeviceBuffer(sizeof(float));
  bind_launches(lt, stream);
}

CudaProgram::~CudaProgram() = default;

Schedule CudaProgram::choose_schedule() {
  ScheduleOptions per_group;
  const bool our_kernels = options_.one_pass_backward && options_.accumulate == Accumulate::f32;
  if (our_kernels) {
    per_group.merge_dgrad_wgrad = one_pass_backward_fits;
    per_group.merge_bias_into_dgrad_wgrad = true;
    per_group.merge_output_layer_backward = output_layer_backward_fits;
    per_group.fold_fetch_into_forward = fetch_fold_fits;
    per_group.merge_input_update = input_update_fits;
  }
  per_group.fold_step_advance = true;
  if (!options_.whole_step) {
    whole_step_note_ = "turned off";
    return build_schedule(graph_, per_group);
  }
  const auto plan = match_whole_step(graph_);
  whole_step_note_ = plan ? whole_step_blocker(graph_, *plan, options_.steps_per_launch, our_kernels)
                          : "the graph is not a plain MLP training step";
  return whole_step_note_.empty() ? build_whole_step_schedule(graph_, *plan) : build_schedule(graph_, per_group);
}

void CudaProgram::bind_dgrad_wgrad(const Launch& l, Bound& bound) const {
  const Node& mm = graph_.node(l.matmul_node);
  const Node& relu_bw = graph_.node(l.nodes[1]);  // the dgrad group: matmul, relu_backward
  if (relu_bw.op != OpKind::relu_backward) throw CudaError("dgrad_wgrad_sgd: the launch does not start with a dgrad");
  const Value& w = graph_.value(mm.inputs[1]);
  bound.a = device_ptr(mm.inputs[0]);
  bound.b = device_ptr(relu_bw.inputs[1]);
  // dX stays in the kernel when only the folded first-layer update reads it.
  const ValueId dx = relu_bw.outputs[0];
  bound.d = std::find(l.writes.begin(), l.writes.end(), dx) != l.writes.end() ? device_ptr(dx) : nullptr;
  bound.w = device_ptr(w.id);
  bound.sgd = scalars_of(l.sgd_node);
  if (l.bias_sgd_node >= 0) {
    const Node& bias_sgd = graph_.node(l.bias_sgd_node);
    if (graph_.value(bias_sgd.inputs[0]).dtype != DType::f16)
      throw CudaError("dgrad_wgrad_sgd: the merged bias update needs an fp16 bias");
    bound.prev_bias = device_ptr(bias_sgd.inputs[0]);
    bound.prev_bias_sgd = scalars_of(l.bias_sgd_node);
  }
  std::int64_t input_width = 0;
  if (l.input_sgd_node >= 0) {
    const Node& wgrad = graph_.node(l.input_wgrad_node);
    const Node& sgd = graph_.node(l.input_sgd_node);
    input_width = graph_.value(wgrad.inputs[1]).shape[1];
    bound.input_update.x = static_cast<const __half*>(device_ptr(wgrad.inputs[1]));
    bound.input_update.w = static_cast<__half*>(device_ptr(sgd.inputs[0]));
    bound.input_update.scalars = scalars_of(sgd.id);
    bound.input_update.width = int(input_width);
  }
  bound.dgrad_wgrad = std::make_unique<DgradWgradSgd>(graph_.value(mm.inputs[0]).shape[0], w.shape[0], w.shape[1],
                                                      0, input_width);
}

void CudaProgram::bind_small_batch_forward(const Launch& l, std::size_t index, Bound& bound) const {
  SmallBatchLinear& f = bound.forward;
  const MatmulShape& s = bound.shape;
  if (!small_batch_forward_fits(s)) throw CudaError("small-batch forward: does not take " + s.describe());
  f.x = static_cast<const __half*>(bound.a);
  f.w = static_cast<const __half*>(bound.b);
  f.bias = static_cast<const __half*>(bound.bias);
  f.y = static_cast<__half*>(bound.d);
  f.batch = int(s.m);
  f.n = int(s.n);
  f.k = int(s.k);
  f.relu = s.epilogue == Epilogue::relu_bias;
  // The first launch of a step follows the previous step's last one, which
  // may update this weight (see SmallBatchLinear::load_weight_early).
  f.load_weight_early = index > 0;
  if (!l.fetches_batch) return;
  const Node& indices = graph_.node(l.nodes[0]);
  const Node& images = graph_.node(graph_.value(graph_.node(l.matmul_node).inputs[0]).producer);
  const Node* labels = nullptr;
  for (NodeId id : l.nodes)
    if (const Node& n = graph_.node(id); n.op == OpKind::gather_rows && n.id != images.id) labels = &n;
  if (indices.op != OpKind::batch_indices || !labels || graph_.value(labels->inputs[0]).dtype != DType::u8)
    throw CudaError("small-batch forward: the folded fetch needs batch_indices and a u8 label gather");
  const Value& perm = graph_.value(indices.inputs[0]);
  if (indices.attrs.batch != s.m) throw CudaError("small-batch forward: the fetched batch is not the matmul's");
  f.fetch.perm = static_cast<const std::int32_t*>(device_ptr(perm.id));
  f.fetch.rows = perm.shape[0];
  f.fetch.step = static_cast<const std::int32_t*>(device_ptr(indices.inputs[1]));
  f.fetch.images = static_cast<const std::uint8_t*>(device_ptr(images.inputs[0]));
  f.fetch.scale = float(images.attrs.scale);
  f.fetch.shift = float(images.attrs.shift);
  f.fetch.labels = static_cast<const std::uint8_t*>(device_ptr(labels->inputs[0]));
  f.fetch.x_out = static_cast<__half*>(device_ptr(images.outputs[0]));
  f.fetch.labels_out = static_cast<std::int32_t*>(device_ptr(labels->outputs[0]));
  // The step's last launch is then a one-pass column-strip launch (it takes
  // the first layer's update), which lets the next step's first launch start
  // only after its own wait: the step counter's writer has completed by then.
  const Launch& last = schedule_.launches.back();
  f.fetch.gather_before_wait = last.kind == LaunchKind::dgrad_wgrad_sgd && last.input_sgd_node >= 0;
}

void CudaProgram::bind_output_layer_backward(const Launch& l, Bound& bound) const {
  const Node& xent = graph_.node(l.nodes[0]);
  const Node& xent_backward = graph_.node(l.nodes[1]);
  const Node& dgrad = graph_.node(l.matmul_node);
  const Node& relu_backward = graph_.node(graph_.value(l.output).producer);
  const Node& out_bias_sgd = graph_.node(l.output_bias_sgd_node);
  const Node& hidden_bias_sgd = graph_.node(l.bias_sgd_node);
  for (ValueId bias : {out_bias_sgd.inputs[0], hidden_bias_sgd.inputs[0]})
    if (graph_.value(bias).dtype != DType::f16)
      throw CudaError("output_layer_backward: the kernel updates fp16 biases only");
  const Value& w = graph_.value(dgrad.inputs[1]);
  OutputLayerBackward& a = bound.output_backward;
  a.logits = static_cast<const __half*>(device_ptr(xent.inputs[0]));
  a.labels = static_cast<const std::int32_t*>(device_ptr(xent.inputs[1]));
  a.h = static_cast<const __half*>(device_ptr(relu_backward.inputs[1]));
  a.w = static_cast<__half*>(device_ptr(w.id));
  a.out_bias = static_cast<__half*>(device_ptr(out_bias_sgd.inputs[0]));
  a.hidden_bias = static_cast<__half*>(device_ptr(hidden_bias_sgd.inputs[0]));
  a.dh = static_cast<__half*>(device_ptr(l.output));
  a.loss = static_cast<float*>(device_ptr(xent.outputs[0]));
  const ValueId dlogits = xent_backward.outputs[0];
  if (std::find(l.writes.begin(), l.writes.end(), dlogits) != l.writes.end())
    a.dlogits = static_cast<__half*>(device_ptr(dlogits));
  if (l.advance_node >= 0) a.step = static_cast<std::int32_t*>(device_ptr(graph_.node(l.advance_node).inputs[0]));
  a.w_sgd = scalars_of(l.sgd_node);
  a.out_bias_sgd = scalars_of(l.output_bias_sgd_node);
  a.hidden_bias_sgd = scalars_of(l.bias_sgd_node);
  a.batch = graph_.value(dlogits).shape[0];
  a.classes = w.shape[0];
  a.hidden = w.shape[1];
}

void CudaProgram::bind_whole_step(const WholeStepPlan& plan, Bound& bound) const {
  auto args = std::make_unique<WholeStepArgs>(whole_step_shape(graph_, plan));
  for (std::size_t l = 0; l < plan.layers.size(); ++l) {
    const WholeStepLayer& layer = plan.layers[l];
    args->weight[l] = static_cast<__half*>(device_ptr(layer.weight));
    args->bias[l] = static_cast<__half*>(device_ptr(layer.bias));
    args->weight_sgd[l] = scalars_of(layer.weight_sgd);
    args->bias_sgd[l] = scalars_of(layer.bias_sgd);
    if (layer.pre_activation_grad >= 0) {  // a hidden layer (the logits never leave the chip)
      args->act[l] = static_cast<__half*>(device_ptr(layer.output));
      args->grad[l] = static_cast<__half*>(device_ptr(layer.pre_activation_grad));
    }
  }
  args->perm = static_cast<const std::int32_t*>(device_ptr(plan.perm));
  args->step = static_cast<std::int32_t*>(device_ptr(plan.step));
  args->images = static_cast<const std::uint8_t*>(device_ptr(plan.images));
  args->labels = static_cast<const std::uint8_t*>(device_ptr(plan.labels));
  args->loss = static_cast<float*>(device_ptr(plan.loss));
  bound.whole_step_launch = plan_whole_step_launch(*args, options_.steps_per_launch);
  bound.whole_step = std::move(args);
}

const SgdScalars* CudaProgram::scalars_of(NodeId sgd_node) const {
  for (std::size_t i = 0; i < sgd_nodes_.size(); ++i)
    if (sgd_nodes_[i] == sgd_node) return sgd_scalars_.as<SgdScalars>() + i;
  throw CudaError(fmt::format("node {} is not an sgd_update", sgd_node));
}

void* CudaProgram::device_ptr(ValueId id) const {
  void* p = value_ptr_.at(static_cast<std::size_t>(id));
  if (!p) throw CudaError(fmt::format("value '{}' lives only inside a fused kernel", graph_.value(id).name));
  return p;
}

DeviceBuffer& CudaProgram::owned(const std::string& name) { return own_.at(name); }

void CudaProgram::bind_launches(const LtHandle& lt, cudaStream_t stream) {
  const auto* k = constants_.as<MatmulConstants>();
  for (const Launch& l : schedule_.launches) {
    auto bound = std::make_unique<Bound>();
    if (l.kind == LaunchKind::whole_step) bind_whole_step(*l.whole_step, *bound);
    if (l.kind == LaunchKind::dgrad_wgrad_sgd) bind_dgrad_wgrad(l, *bound);
    if (l.kind == LaunchKind::output_layer_backward) bind_output_layer_backward(l, *bound);
    if (l.kind == LaunchKind::matmul) {
      const Node& mm = graph_.node(l.matmul_node);
      MatmulShape shape = operand_shape(graph_, mm);
      shape.epilogue = lt_epilogue(l.epilogue);

      const Node* sgd = l.sgd_node >= 0 ? &graph_.node(l.sgd_node) : nullptr;
      ValueId target = l.output;
      if (l.target == MatmulTarget::param_sgd) target = sgd->inputs[0];
      if (l.target == MatmulTarget::velocity_sgd) target = sgd->inputs[2];
      shape.cd_type = elem_type(graph_.value(target).dtype);
      // cuBLASLt has no fp16 accumulation into fp32 outputs (master weights).
      const bool f16 = options_.accumulate == Accumulate::f16 && shape.cd_type == ElemType::f16;
      shape.accumulate = f16 ? Accumulate::f16 : Accumulate::f32;
      shape.reads_c = sgd != nullptr;  // beta: 1 - lr * wd into W, or the momentum into the velocity

      bound->shape = shape;
      bound->impl = pick_matmul_impl(shape, l, options_.one_pass_backward);
      if (bound->impl == MatmulImpl::small_k_dgrad_relu) {
        if (shape.ab_type != ElemType::f16 || shape.trans_a || shape.trans_b || shape.k > kSmallLinearMaxDim)
          throw CudaError("a relu-output-masked dgrad needs fp16 operands, no transposes and K <= 32: " + shape.describe());
        bound->relu_out = device_ptr(graph_.node(l.nodes.back()).inputs[1]);
      }
      if (bound->impl == MatmulImpl::cublaslt)
        bound->matmul = std::make_unique<LtMatmul>(lt, shape, options_.autotune, stream);
      if (sgd) bound->sgd = scalars_of(sgd->id);
      bound->a = device_ptr(mm.inputs[0]);
      bound->b = device_ptr(mm.inputs[1]);
      bound->d = device_ptr(target);
      bound->c = bound->d;
      bound->alpha = f16 ? static_cast<const void*>(&k->one_h) : &k->one;
      bound->beta = f16 ? static_cast<const void*>(&k->zero_h) : &k->zero;
      if (sgd) {
        const SgdScalars* s = scalars_of(sgd->id);
        if (l.target == MatmulTarget::param_sgd) {
          bound->alpha = f16 ? static_cast<const void*>(&s->neg_lr_h) : &s->neg_lr;
          bound->beta = f16 ? static_cast<const void*>(&s->one_minus_lr_wd_h) : &s->one_minus_lr_wd;
        } else {
          bound->beta = f16 ? static_cast<const void*>(&s->momentum_h) : &s->momentum;
        }
      }
      if (l.bias >= 0) bound->bias = device_ptr(l.bias);
      const int mask = l.aux_write >= 0 ? l.aux_write : l.aux_read;
      if (mask >= 0) {
        const int slot = buffer_of_mask_[static_cast<std::size_t>(mask)];
        bound->aux = arena_.as<char>() + plan_.slots[static_cast<std::size_t>(slot)].offset;
      }
      if (bound->impl == MatmulImpl::small_batch_forward)
        bind_small_batch_forward(l, bound_.size(), *bound);
    }
    bound_.push_back(std::move(bound));
  }
}

void CudaProgram::record(cudaStream_t stream) const {
  for (std::size_t i = 0; i < schedule_.launches.size(); ++i) record_launch(i, stream);
}

void CudaProgram::record_steps(cudaStream_t stream, std::int64_t steps) const {
  if (schedule_.launches.size() == 1 && schedule_.launches[0].kind == LaunchKind::whole_step &&
      bound_[0]->whole_step_launch.resident) {
    launch_whole_step(*bound_[0]->whole_step, bound_[0]->whole_step_launch, stream, static_cast<int>(steps));
    return;
  }
  for (std::int64_t s = 0; s < steps; ++s) record(stream);
}

void CudaProgram::record_launch(std::size_t index, cudaStream_t stream) const {
  const Launch& l = schedule_.launches.at(index);
  switch (l.kind) {
    case LaunchKind::matmul:
      record_matmul(l, *bound_[index], stream);
      return;
    case LaunchKind::batch_fetch: {
      const Node& bi = graph_.node(l.nodes[0]);
      const Node* images = nullptr;
      const Node* labels = nullptr;
      for (std::size_t i = 1; i < l.nodes.size(); ++i) {
        const Node& gather = graph_.node(l.nodes[i]);
        (graph_.value(gather.outputs[0]).dtype == DType::i32 ? labels : images) = &gather;
      }
      if (!images || !labels || l.nodes.size() != 3)
        throw CudaError("batch_fetch: the CUDA kernel fetches exactly one image and one label gather");
      const Value& table = graph_.value(images->inputs[0]);
      if (table.dtype != DType::u8 || graph_.value(labels->inputs[0]).dtype != DType::u8)
        throw CudaError("batch_fetch: the CUDA kernel reads u8 image and label tables");
      const Value& perm = graph_.value(bi.inputs[0]);
      with_float_type(graph_.value(images->outputs[0]).dtype, [&](auto tag) {
        using T = decltype(tag);
        launch_batch_fetch(static_cast<const std::int32_t*>(device_ptr(perm.id)), perm.shape[0],
                           static_cast<const std::int32_t*>(device_ptr(bi.inputs[1])), bi.attrs.batch,
                           static_cast<const std::uint8_t*>(device_ptr(table.id)), table.shape[1],
                           float(images->attrs.scale), float(images->attrs.shift),
                           static_cast<T*>(device_ptr(images->outputs[0])),
                           static_cast<const std::uint8_t*>(device_ptr(labels->inputs[0])),
                           static_cast<std::int32_t*>(device_ptr(labels->outputs[0])), stream);
      });
      return;
    }
    case LaunchKind::xent: {
      const Node& fwd = graph_.node(l.nodes[0]);
      const Node& bwd = graph_.node(l.nodes[1]);
      const Value& logits = graph_.value(fwd.inputs[0]);
      with_float_type(logits.dtype, [&](auto tag) {
        using T = decltype(tag);
        launch_softmax_xent(static_cast<const T*>(device_ptr(logits.id)),
                            static_cast<const std::int32_t*>(device_ptr(fwd.inputs[1])), logits.shape[0],
                            logits.shape[1], static_cast<float*>(device_ptr(fwd.outputs[0])),
                            static_cast<T*>(device_ptr(bwd.outputs[0])), stream);
      });
      return;
    }
    case LaunchKind::bias_grad_sgd: {
      const Node& reduce = graph_.node(l.nodes[0]);
      const Node& sgd = graph_.node(l.sgd_node);
      const Value& dy = graph_.value(reduce.inputs[0]);
      const Value& bias = graph_.value(sgd.inputs[0]);
      void* velocity = sgd.inputs.size() == 3 ? device_ptr(sgd.inputs[2]) : nullptr;
      const SgdScalars* s = scalars_of(sgd.id);
      auto* advance = l.advance_node >= 0
                          ? static_cast<std::int32_t*>(device_ptr(graph_.node(l.advance_node).inputs[0]))
                          : nullptr;
      if (bias.dtype == DType::f16 && dy.dtype == DType::f16)
        launch_bias_grad_sgd(static_cast<const __half*>(device_ptr(dy.id)), dy.shape[0], dy.shape[1],
                             static_cast<__half*>(device_ptr(bias.id)), static_cast<__half*>(velocity), s, stream,
                             advance);
      else if (bias.dtype == DType::f32 && dy.dtype == DType::f16)
        launch_bias_grad_sgd(static_cast<const __half*>(device_ptr(dy.id)), dy.shape[0], dy.shape[1],
                             static_cast<float*>(device_ptr(bias.id)), static_cast<float*>(velocity), s, stream,
                             advance);
      else if (bias.dtype == DType::f32 && dy.dtype == DType::f32)
        launch_bias_grad_sgd(static_cast<const float*>(device_ptr(dy.id)), dy.shape[0], dy.shape[1],
                             static_cast<float*>(device_ptr(bias.id)), static_cast<float*>(velocity), s, stream,
                             advance);
      else
        throw CudaError("bias_grad_sgd: unsupported dtype pair (f16 bias with f32 gradient)");
      return;
    }
    case LaunchKind::single:
      record_single(graph_.node(l.nodes[0]), stream);
      return;
    case LaunchKind::dgrad_wgrad_sgd: {
      const Bound& b = *bound_[index];
      b.dgrad_wgrad->launch(static_cast<const __half*>(b.a), static_cast<const __half*>(b.b), static_cast<__half*>(b.w),
                            static_cast<__half*>(b.d), b.sgd, stream, static_cast<__half*>(b.prev_bias),
                            b.prev_bias_sgd, b.input_update);
      return;
    }
    case LaunchKind::output_layer_backward:
      launch_output_layer_backward(bound_[index]->output_backward, stream);
      return;
    case LaunchKind::whole_step:
      launch_whole_step(*bound_[index]->whole_step, bound_[index]->whole_step_launch, stream);
      return;
  }
}

void CudaProgram::record_matmul(const Launch& l, const Bound& b, cudaStream_t stream) const {
  const MatmulShape& s = b.shape;
  switch (b.impl) {
    case MatmulImpl::small_n_forward:
      launch_linear_small_n(static_cast<const __half*>(b.a), static_cast<const __half*>(b.b),
                            static_cast<const __half*>(b.bias), s.m, s.n, s.k, static_cast<__half*>(b.d), stream);
      return;
    case MatmulImpl::small_m_wgrad_sgd:  // D = W: the update in place, as cuBLASLt would write it
      if (s.cd_type == ElemType::f16)
        launch_wgrad_sgd_small_m(static_cast<const __half*>(b.a), static_cast<const __half*>(b.b), s.k, s.m, s.n,
                                 static_cast<__half*>(b.d), b.sgd, stream);
      else
        launch_wgrad_sgd_small_m(static_cast<const __half*>(b.a), static_cast<const __half*>(b.b), s.k, s.m, s.n,
                                 static_cast<float*>(b.d), b.sgd, stream);
      return;
    case MatmulImpl::small_batch_forward:
      launch_small_batch_linear(b.forward, stream);
      return;
    case MatmulImpl::small_k_dgrad_relu:
      launch_dgrad_relu_small_k(static_cast<const __half*>(b.a), static_cast<const __half*>(b.b),
                                static_cast<const __half*>(b.relu_out), s.m, s.n, s.k, static_cast<__half*>(b.d),
                                stream);
      return;
    case MatmulImpl::cublaslt:
      break;
  }
  b.matmul->run(b.a, b.b, b.c, b.d, b.alpha, b.beta, b.bias, b.aux, stream);
  if (l.target != MatmulTarget::velocity_sgd) return;
  // The matmul wrote v = momentum*v + g; finish with v += wd*w, w -= lr*v.
  const Node& sgd = graph_.node(l.sgd_node);
  const Value& w = graph_.value(sgd.inputs[0]);
  with_float_type(w.dtype, [&](auto tag) {
    using T = decltype(tag);
    launch_momentum_finish(static_cast<T*>(device_ptr(w.id)), static_cast<T*>(device_ptr(sgd.inputs[2])),
                           element_count(w.shape), scalars_of(sgd.id), stream);
  });
}

void CudaProgram::record_single(const Node& n, cudaStream_t stream) const {
  auto in = [&](std::size_t slot) { return device_ptr(n.inputs[slot]); };
  const Value& x = graph_.value(n.inputs[0]);
  const auto count = element_count(x.shape);
  switch (n.op) {
    case OpKind::advance_step:
      launch_advance_step(static_cast<std::int32_t*>(in(0)), stream);
      return;
    case OpKind::cast: {
      const Value& y = graph_.value(n.outputs[0]);
      void* out = device_ptr(y.id);
      if (x.dtype == y.dtype)
        SG_CUDA_CHECK(cudaMemcpyAsync(out, in(0), value_bytes(x), cudaMemcpyDeviceToDevice, stream));
      else if (x.dtype == DType::f32)
        launch_cast(static_cast<const float*>(in(0)), count, static_cast<__half*>(out), stream);
      else
        launch_cast(static_cast<const __half*>(in(0)), count, static_cast<float*>(out), stream);
      return;
    }
    case OpKind::sgd_update: {
      const Value& g = graph_.value(n.inputs[1]);
      void* v = n.inputs.size() == 3 ? in(2) : nullptr;
      const SgdScalars* s = scalars_of(n.id);
      if (x.dtype == DType::f16 && g.dtype == DType::f16)
        launch_sgd_update(static_cast<__half*>(in(0)), static_cast<const __half*>(in(1)), static_cast<__half*>(v), count, s, stream);
      else if (x.dtype == DType::f32 && g.dtype == DType::f32)
        launch_sgd_update(static_cast<float*>(in(0)), static_cast<const float*>(in(1)), static_cast<float*>(v), count, s, stream);
      else
        launch_sgd_update(static_cast<float*>(in(0)), static_cast<const __half*>(in(1)), static_cast<float*>(v), count, s, stream);
      return;
    }
    default:
      break;
  }
  with_float_type(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    auto cin = [&](std::size_t slot) { return static_cast<const T*>(in(slot)); };
    auto out = [&]() { return static_cast<T*>(device_ptr(n.outputs[0])); };
    const auto rows = x.shape[0];
    const auto cols = x.shape.size() > 1 ? x.shape[1] : 1;
    switch (n.op) {
      case OpKind::bias_add: launch_bias_add(cin(0), cin(1), rows, cols, out(), stream); return;
      case OpKind::relu: launch_relu(cin(0), count, out(), stream); return;
      case OpKind::relu_backward: launch_relu_backward(cin(0), cin(1), count, out(), stream); return;
      case OpKind::add: launch_add(cin(0), cin(1), count, out(), stream); return;
      case OpKind::reduce_rows: launch_reduce_rows(cin(0), rows, cols, out(), stream); return;
      case OpKind::softmax_xent:
        launch_softmax_xent(cin(0), static_cast<const std::int32_t*>(in(1)), rows, cols,
                            static_cast<float*>(device_ptr(n.outputs[0])), static_cast<T*>(nullptr), stream);
        return;
      case OpKind::softmax_xent_backward:
        launch_softmax_xent(cin(0), static_cast<const std::int32_t*>(in(1)), rows, cols, scratch_loss_.as<float>(),
                            out(), stream);
        return;
      case OpKind::count_correct:
        launch_count_correct(cin(0), static_cast<const std::int32_t*>(in(1)), rows, cols,
                             static_cast<std::int32_t*>(device_ptr(n.outputs[0])), stream);
        return;
      default:
        throw CudaError(fmt::format("cuda backend: no kernel for a lone {} (node {})", op_name(n.op), n.id));
    }
  });
}

std::string CudaProgram::launch_label(std::size_t index) const {
  const Launch& l = schedule_.launches.at(index);
  std::vector<std::string> ops;
  for (NodeId n : l.nodes) ops.push_back(std::string(op_name(graph_.node(n).op)));
  std::string kind(launch_kind_name(l.kind));
  if (l.kind == LaunchKind::matmul) {
    kind += fmt::format("[{}]", epilogue_name(l.epilogue));
    if (l.target != MatmulTarget::output) kind += "+sgd";
    if (bound_[index]->impl == MatmulImpl::small_batch_forward) kind += " (small-batch dependent-launch kernel)";
    else if (bound_[index]->impl != MatmulImpl::cublaslt) kind += " (small-dim kernel)";
  }
  if (l.kind == LaunchKind::single) kind = ops.front();
  if (l.kind == LaunchKind::whole_step)
    return fmt::format("L{} whole_step ({} nodes, {} blocks as {})", index, l.nodes.size(),
                       bound_[index]->whole_step_launch.blocks,
                       bound_[index]->whole_step_launch.resident ? "one cluster, weights resident in shared memory"
                       : bound_[index]->whole_step_launch.cluster ? "one cluster"
                                                                  : "a cooperative grid");
  return fmt::format("L{} {} ({})", index, kind, fmt::join(ops, "+"));
}

void CudaProgram::set_learning_rate(double lr, cudaStream_t stream) {
  std::vector<SgdScalars> scalars;
  for (NodeId id : sgd_nodes_) {
    const Node& n = graph_.node(id);
    scalars.push_back(make_sgd_scalars(float(lr), float(n.attrs.momentum), float(n.attrs.weight_decay)));
  }
  if (!scalars.empty()) uploader_->upload(sgd_scalars_.data(), scalars.data(), stream);
  graph_.set_sgd_learning_rate(lr);
}

std::vector<std::pair<std::string, double>> CudaProgram::profile_whole_step(int repeats, cudaStream_t stream) const {
  const auto it = std::find_if(schedule_.launches.begin(), schedule_.launches.end(),
                               [](const Launch& l) { return l.kind == LaunchKind::whole_step; });
  if (it == schedule_.launches.end()) throw CudaError("profile_whole_step: this program has no whole-step launch");
  const Bound& bound = *bound_[static_cast<std::size_t>(it - schedule_.launches.begin())];
  const auto names = whole_step_phase_names(*bound.whole_step, bound.whole_step_launch);
  DeviceBuffer clock((names.size() + 1) * sizeof(unsigned long long));
  WholeStepArgs args = *bound.whole_step;
  args.phase_clock = clock.as<unsigned long long>();
  std::vector<std::vector<double>> us(names.size());
  std::vector<unsigned long long> ns(names.size() + 1);
  for (int r = 0; r < repeats; ++r) {
    launch_whole_step(args, bound.whole_step_launch, stream);
    SG_CUDA_CHECK(cudaStreamSynchronize(stream));
    clock.download(ns.data(), ns.size() * sizeof(unsigned long long));
    for (std::size_t i = 0; i < names.size(); ++i) us[i].push_back(double(ns[i + 1] - ns[i]) / 1e3);
  }
  std::vector<std::pair<std::string, double>> out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    std::sort(us[i].begin(), us[i].end());
    out.emplace_back(names[i], us[i][us[i].size() / 2]);
  }
  return out;
}

void CudaProgram::poison_arena(cudaStream_t stream) const {
  if (arena_.bytes()) launch_poison(arena_.data(), arena_.bytes(), stream);
}

}  // namespace sg::cuda
