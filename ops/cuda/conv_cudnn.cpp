#include "ops/cuda/conv_cudnn.hpp"

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <fmt/format.h>

#include "ops/cuda/cuda_resources.hpp"
#include "ops/cuda/gpu_timing.hpp"

namespace sg::cuda {
namespace {

// Tensor ids inside one convolution's cuDNN graph.
enum Uid : std::int64_t { kX = 1, kW = 2, kY = 3, kBias = 4, kConvOut = 5, kBiasOut = 6 };

// How many engines are timed at most (each costs a handful of runs at
// start-up; cuDNN 9 has a few dozen for a convolution).
constexpr std::size_t kCandidates = 32;

struct GraphTensors {
  cudnn::Descriptor x, w, y, bias, conv_out, bias_out;
};

cudnn::Descriptor convolution_descriptor(const ConvGeometry& g) {
  cudnn::Descriptor conv(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const std::int64_t dims = 2;
  conv.set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
  conv.set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
  conv.set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &dims);
  conv.set_int64s(CUDNN_ATTR_CONVOLUTION_DILATIONS, {1, 1});
  conv.set_int64s(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, {g.stride, g.stride});
  conv.set_int64s(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, {g.padding, g.padding});
  conv.set_int64s(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, {g.padding, g.padding});
  conv.finalize();
  return conv;
}

// dims are always N, C, H, W (cuDNN's order); `channels_last` strides them
// as [N,H,W,C] in memory.
cudnn::Descriptor tensor(std::int64_t uid, cudnnDataType_t type, std::vector<std::int64_t> dims, const void* pointer,
                         bool is_virtual = false, bool channels_last = false) {
  cudnn::TensorSpec spec;
  spec.uid = uid;
  spec.type = type;
  spec.strides = channels_last ? std::vector<std::int64_t>{dims[1] * dims[2] * dims[3], 1, dims[3] * dims[1], dims[1]}
                               : cudnn::packed_strides(dims);
  spec.dims = std::move(dims);
  spec.is_virtual = is_virtual;
  spec.alignment = is_virtual ? 16 : cudnn::pointer_alignment(pointer);
  return cudnn::make_tensor(spec);
}

cudnn::Descriptor pointwise_op(cudnnPointwiseMode_t mode, const cudnn::Descriptor& x, const cudnn::Descriptor* b,
                               const cudnn::Descriptor& y) {
  cudnn::Descriptor pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  const cudnnDataType_t precision = CUDNN_DATA_FLOAT;
  pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
  pw.set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &precision);
  pw.finalize();
  cudnn::Descriptor op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  op.set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
  op.set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
  if (b) op.set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
  op.set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
  op.finalize();
  return op;
}

// The attribute names of one convolution operation, x, w and y in the
// forward's roles (dX, W, dY for the data gradient; X, dW, dY for the filter's).
struct ConvOpAttributes {
  cudnnBackendDescriptorType_t type;
  cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
};
constexpr ConvOpAttributes kForwardOp{
    CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
    CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,             CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
    CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,     CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
    CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA};
constexpr ConvOpAttributes kBackwardDataOp{
    CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
    CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,                  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
    CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
    CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA};
constexpr ConvOpAttributes kBackwardFilterOp{
    CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
    CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,                 CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
    CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
    CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA};

// One convolution operation (alpha 1, beta 0: it overwrites its output).
cudnn::Descriptor convolution_op(const ConvOpAttributes& a, const cudnn::Descriptor& x, const cudnn::Descriptor& w,
                                 const cudnn::Descriptor& y, const cudnn::Descriptor& conv) {
  const float alpha = 1.0f, beta = 0.0f;
  cudnn::Descriptor op(a.type);
  op.set_descriptor(a.x, x);
  op.set_descriptor(a.w, w);
  op.set_descriptor(a.y, y);
  op.set_descriptor(a.conv, conv);
  op.set(a.alpha, CUDNN_TYPE_FLOAT, 1, &alpha);
  op.set(a.beta, CUDNN_TYPE_FLOAT, 1, &beta);
  op.finalize();
  return op;
}

// Which plans plans_for returns: each engine's own configuration (every
// engine's with `every_engine`), or up to `variants` knob variants of the engines `vary`.
struct PlanSet {
  bool every_engine = false;
  const std::vector<std::int64_t>* vary = nullptr;
  std::size_t variants = 0;

  static PlanSet engines(bool every_engine) { return {every_engine, nullptr, 0}; }
  static PlanSet knob_variants_of(const std::vector<std::int64_t>& engines, std::size_t variants) {
    return {false, &engines, variants};
  }
};

// The plans for one convolution graph; `fused` puts bias [+ ReLU] inside it.
std::vector<cudnn::Plan> plans_for(const cudnn::Handle& handle, const ConvRequest& r, const ConvTensors& t, bool fused,
                                   const PlanSet& set) {
  const ConvGeometry& g = r.geometry;
  const std::vector<std::int64_t> x_dims{g.n, g.c, g.h, g.w}, w_dims{g.k, g.c, g.r, g.s}, y_dims{g.n, g.k, g.p(), g.q()};
  GraphTensors gt;
  const bool last = r.channels_last;
  gt.x = tensor(kX, r.io_type, x_dims, t.x, false, last);
  gt.w = tensor(kW, r.io_type, w_dims, t.w, false, r.filter_channels_last);
  gt.y = tensor(kY, r.io_type, y_dims, t.y, false, last);
  const cudnn::Descriptor conv = convolution_descriptor(g);
  std::vector<cudnn::Descriptor> ops;
  switch (r.direction) {
    case ConvDirection::forward:
      if (fused) gt.conv_out = tensor(kConvOut, CUDNN_DATA_FLOAT, y_dims, nullptr, true, last);
      ops.push_back(convolution_op(kForwardOp, gt.x, gt.w, fused ? gt.conv_out : gt.y, conv));
      if (fused) {
        gt.bias = tensor(kBias, r.io_type, {1, g.k, 1, 1}, t.bias);
        if (r.relu) gt.bias_out = tensor(kBiasOut, CUDNN_DATA_FLOAT, y_dims, nullptr, true, last);
        ops.push_back(pointwise_op(CUDNN_POINTWISE_ADD, gt.conv_out, &gt.bias, r.relu ? gt.bias_out : gt.y));
        if (r.relu) ops.push_back(pointwise_op(CUDNN_POINTWISE_RELU_FWD, gt.bias_out, nullptr, gt.y));
      }
      break;
    case ConvDirection::backward_data: ops.push_back(convolution_op(kBackwardDataOp, gt.x, gt.w, gt.y, conv)); break;
    case ConvDirection::backward_filter: ops.push_back(convolution_op(kBackwardFilterOp, gt.x, gt.w, gt.y, conv)); break;
  }
  cudnn::Descriptor graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  std::vector<cudnnBackendDescriptor_t> raw;
  for (const auto& op : ops) raw.push_back(op.get());
  const cudnnHandle_t h = handle.get();
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<std::int64_t>(raw.size()),
            raw.data());
  if (!graph.try_finalize()) return {};
  // Replays and resumes must give the same bits: no atomics-based engines;
  // fp32 tensors stay fp32 (no TF32 or down-converted inputs), so the CPU
  // reference remains the oracle.
  // FFT and Winograd engines round differently from a direct sum (errors of
  // 1e-4 on fp32 were seen), so they are left out too.
  std::vector<cudnnBackendNumericalNote_t> excluded{
      CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC,  CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS,
      CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION, CUDNN_NUMERICAL_NOTE_FFT, CUDNN_NUMERICAL_NOTE_WINOGRAD,
      CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4, CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6,
      CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13};
  if (r.io_type == CUDNN_DATA_FLOAT) excluded.push_back(CUDNN_NUMERICAL_NOTE_TENSOR_CORE);
  if (set.vary) return cudnn::knob_variant_plans(handle, graph, *set.vary, set.variants, excluded);
  return cudnn::candidate_plans(handle, graph, kCandidates, excluded, set.every_engine);
}

// What identifies a convolution problem for the engine choice.
std::string cache_key(const ConvRequest& r) {
  const ConvGeometry& g = r.geometry;
  return fmt::format("{}:{}x{}x{}x{}:{}x{}x{}:s{}p{}:t{}:b{}r{}:l{}{}", static_cast<int>(r.direction), g.n, g.c, g.h,
                     g.w, g.k, g.r, g.s, g.stride, g.padding, static_cast<int>(r.io_type), r.bias, r.relu,
                     r.channels_last, r.filter_channels_last);
}

// The engines (and knob settings) autotune chose in this process, by problem.
using EngineChoice = std::pair<std::int64_t, std::string>;
std::mutex chosen_mutex;
std::map<std::string, EngineChoice>& chosen_engines() {
  static std::map<std::string, EngineChoice> engines;
  return engines;
}

std::optional<EngineChoice> chosen_engine(const std::string& key) {
  const std::lock_guard lock(chosen_mutex);
  const auto it = chosen_engines().find(key);
  if (it == chosen_engines().end()) return std::nullopt;
  return it->second;
}

void remember_engine(const std::string& key, const EngineChoice& engine) {
  const std::lock_guard lock(chosen_mutex);
  chosen_engines().emplace(key, engine);
}

bool is_choice(const cudnn::Plan& p, const EngineChoice& c) { return p.engine == c.first && p.knobs == c.second; }

// The output a convolution writes, and its bytes.
std::pair<void*, std::size_t> output_of(const ConvRequest& r, const ConvTensors& t) {
  const ConvGeometry& g = r.geometry;
  const std::size_t element = r.io_type == CUDNN_DATA_FLOAT ? 4 : 2;
  switch (r.direction) {
    case ConvDirection::forward: return {t.y, std::size_t(g.n * g.k * g.p() * g.q()) * element};
    case ConvDirection::backward_data: return {t.x, std::size_t(g.n * g.c * g.h * g.w) * element};
    case ConvDirection::backward_filter: break;
  }
  return {t.w, std::size_t(g.k * g.c * g.r * g.s) * element};
}

const char* direction_name(ConvDirection d) {
  switch (d) {
    case ConvDirection::forward: return "forward";
    case ConvDirection::backward_data: return "backward data";
    case ConvDirection::backward_filter: return "backward filter";
  }
  return "?";
}

}  // namespace

CudnnConv::CudnnConv(const cudnn::Handle& handle, const ConvRequest& request, const ConvTensors& tensors,
                     cudaStream_t stream, bool autotune, std::size_t knob_variants)
    : handle_(handle), request_(request) {
  const bool epilogue = request.direction == ConvDirection::forward && request.bias;
  std::vector<cudnn::Plan> plans;
  const PlanSet engines = PlanSet::engines(autotune);
  if (epilogue) plans = plans_for(handle, request, tensors, true, engines);
  fused_epilogue_ = !plans.empty();
  if (plans.empty()) plans = plans_for(handle, request, tensors, false, engines);
  const ConvGeometry& g = request.geometry;
  if (plans.empty())
    throw CudaError(fmt::format("cuDNN offers no deterministic engine for the conv {} of {}x{}x{}x{} by {}x{}x{}x{} "
                                "(stride {}, padding {})",
                                direction_name(request.direction), g.n, g.c, g.h, g.w, g.k, g.c, g.r, g.s, g.stride,
                                g.padding));
  // Without autotune: the heuristics' first engine that runs, the same one
  // in every process (replays, stream launches and resumes agree bit for
  // bit). With it: the fastest by timing, once per problem in this process,
  // so every program of the run uses the same engine.
  const std::string key = fmt::format("{}|{}|{}", cache_key(request), fused_epilogue_, knob_variants);
  std::optional<EngineChoice> chosen;
  if (autotune) chosen = chosen_engine(key);
  // (Another program's candidates may differ, e.g. by its buffers' alignment: then time these.)
  if (chosen && !chosen->second.empty()) {  // a knob variant: its engine's variants hold it
    const std::vector<std::int64_t> engine{chosen->first};
    const PlanSet variants_of_engine = PlanSet::knob_variants_of(engine, knob_variants);
    for (auto& v : plans_for(handle, request, tensors, fused_epilogue_, variants_of_engine))
      plans.push_back(std::move(v));
  }
  if (chosen && std::none_of(plans.begin(), plans.end(), [&](const cudnn::Plan& p) { return is_choice(p, *chosen); }))
    chosen.reset();
  std::int64_t most = 0;
  for (const auto& p : plans) most = std::max(most, p.workspace_bytes);
  DeviceBuffer workspace(static_cast<std::size_t>(most));
  std::vector<std::pair<float, std::size_t>> timed;  // (us, plan index), every candidate that ran
  const bool timing = autotune && !chosen;
  // Runs plans[i] once (does it run this problem?) and, when timing, times it on the real buffers, in one workspace
  // that fits them all, as GPU time alone (gpu_timing.hpp: the graph replays it without cuDNN's host work).
  const auto try_plan = [&](std::size_t i) {
    plan_ = std::move(plans[i]);
    float us = 0.0f;
    bool ran = true;
    try {
      run(tensors, workspace.data(), stream);
      SG_CUDA_CHECK(cudaStreamSynchronize(stream));
      if (timing) us = gpu_time_us(stream, 2, 3, [&](cudaStream_t s) { run(tensors, workspace.data(), s); });
    } catch (const CudaError&) {
      SG_CUDA_CHECK(cudaStreamSynchronize(stream));
      ran = false;  // an engine that finalized but cannot run this problem
    }
    plans[i] = std::move(plan_);
    if (ran) timed.emplace_back(us, i);
    return ran;
  };
  for (std::size_t i = 0; i < plans.size(); ++i) {
    if (chosen && !is_choice(plans[i], *chosen)) continue;
    // Without timing: the heuristics' order, or the engine this process chose before.
    if (try_plan(i) && !timing) break;
  }
  std::stable_sort(timed.begin(), timed.end());
  if (timing && knob_variants > 0) {
    // Then the knob variants of the three fastest precompiled engines: an engine's best configuration is
    // near its default one far more often than a slow engine's is the fastest, and timing every engine's
    // variants cost seconds at start-up (mnist_resnet's bench 7 -> 20 s).
    constexpr std::size_t kVariedEngines = 3;
    std::vector<std::int64_t> fastest;
    for (const auto& [us, i] : timed)
      if (!plans[i].runtime_compiled && fastest.size() < kVariedEngines &&
          std::find(fastest.begin(), fastest.end(), plans[i].engine) == fastest.end())
        fastest.push_back(plans[i].engine);
    std::vector<cudnn::Plan> variants =
        plans_for(handle, request, tensors, fused_epilogue_, PlanSet::knob_variants_of(fastest, knob_variants));
    for (const auto& p : variants) most = std::max(most, p.workspace_bytes);
    if (static_cast<std::size_t>(most) > workspace.bytes()) workspace = DeviceBuffer(static_cast<std::size_t>(most));
    for (auto& v : variants) {
      plans.push_back(std::move(v));
      try_plan(plans.size() - 1);
    }
    std::stable_sort(timed.begin(), timed.end());
  }
  candidates_ = static_cast<int>(plans.size());
  // The fastest; a knob variant only once three runs of it gave the same bits (an engine's numerical notes
  // are the engine's, not its configuration's: a split-K setting must not bring atomics into a replay).
  std::optional<std::size_t> best;
  for (const auto& [us, i] : timed) {
    if (!plans[i].knobs.empty() && timing) {
      plan_ = std::move(plans[i]);
      const bool same = deterministic_output(tensors, workspace.data(), stream);
      plans[i] = std::move(plan_);
      if (!same) continue;
    }
    best = i;
    break;
  }
  if (!best) throw CudaError(fmt::format("no cuDNN engine ran the conv {}", direction_name(request.direction)));
  plan_ = std::move(plans[*best]);
  timed_ = timing;
  if (autotune) remember_engine(key, {plan_.engine, plan_.knobs});
}

bool CudnnConv::deterministic_output(const ConvTensors& t, void* workspace, cudaStream_t stream) const {
  const auto [output, bytes] = output_of(request_, t);
  std::vector<unsigned char> first(bytes), again(bytes);
  for (int i = 0; i < 3; ++i) {
    run(t, workspace, stream);
    SG_CUDA_CHECK(cudaMemcpyAsync(i == 0 ? first.data() : again.data(), output, bytes, cudaMemcpyDeviceToHost, stream));
    SG_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (i > 0 && first != again) return false;
  }
  return true;
}

void CudnnConv::run(const ConvTensors& t, void* workspace, cudaStream_t stream) const {
  std::vector<std::int64_t> uids{kX, kW, kY};
  std::vector<void*> pointers{t.x, t.w, t.y};
  if (fused_epilogue_) {
    uids.push_back(kBias);
    pointers.push_back(const_cast<void*>(t.bias));
  }
  cudnn::execute(handle_, plan_, uids, pointers, workspace, stream);
  if (request_.direction != ConvDirection::forward || !request_.bias || fused_epilogue_) return;
  const ConvGeometry& g = request_.geometry;
  // A channels-last y is [rows, k]: channel i % k, as NCHW with planes of one.
  const std::int64_t hw = request_.channels_last ? 1 : g.p() * g.q();
  const std::int64_t n = request_.channels_last ? g.n * g.p() * g.q() : g.n;
  switch (request_.io_type) {
    case CUDNN_DATA_HALF:
      launch_channel_bias(static_cast<__half*>(t.y), static_cast<const __half*>(t.bias), n, g.k, hw, request_.relu, stream);
      break;
    case CUDNN_DATA_BFLOAT16:
      launch_channel_bias(static_cast<__nv_bfloat16*>(t.y), static_cast<const __nv_bfloat16*>(t.bias), n, g.k, hw,
                          request_.relu, stream);
      break;
    default:
      launch_channel_bias(static_cast<float*>(t.y), static_cast<const float*>(t.bias), n, g.k, hw, request_.relu, stream);
  }
}

std::string CudnnConv::label() const {
  std::string epilogue;
  if (request_.direction == ConvDirection::forward && request_.bias) {
    const std::string what = request_.relu ? "bias+relu" : "bias";
    epilogue = fused_epilogue_ ? ", fused " + what : ", then our " + what + " kernel";
  }
  return fmt::format("cuDNN engine {}{}{}{}{}{} ({})", plan_.engine,
                     plan_.knobs.empty() ? "" : fmt::format(" [{}]", plan_.knobs),
                     request_.channels_last ? ", channels-last" : "",
                     request_.filter_channels_last ? ", filter [K,R,S,C]" : "",
                     plan_.runtime_compiled ? " (runtime-compiled)" : "",
                     epilogue,
                     timed_ ? fmt::format("fastest of {} timed", candidates_)
                            : "the heuristics' first that runs; backend.autotune times them all");
}

}  // namespace sg::cuda
