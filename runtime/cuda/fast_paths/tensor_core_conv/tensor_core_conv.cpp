// Lowering tensor_core_conv (fast path tensor_core_conv: its record is
// tensor_core_conv_record.cpp): a channels-last conv2d [+ bias] [+ its relu],
// or a channels-last conv2d_backward_data at stride 1, in f16 / bf16, by our
// tensor-core kernels (ops/cuda/fast_paths/tensor_core_conv/: the halo form
// and the implicit GEMM), opted into by backend.conv_kernels: tensor_core.
// Without backend.autotune ours runs wherever it takes the shape, with the
// tile chosen from the shape. With it, every tile and cuDNN's fastest engine
// are timed once per problem in the process (on the launch's own buffers, ten
// runs back to back) and ours is bound only where it beat cuDNN by kMargin,
// since a timing on a stream is not the launch's time inside the step's
// graph (the label says which ran and the times). Not under `auto`: in one
// H200 run the timed choice moved mnist_resnet by -1% and one unnamed CNN by
// +9% (docs/benchmarks.md), so no default figure depends on it yet.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>

#include "ops/cuda/fast_paths/tensor_core_conv/conv_nhwc_mma.hpp"
#include "ops/cuda/cuda_resources.hpp"
#include "ops/cuda/gpu_timing.hpp"
#include "runtime/cuda/lowerings/conv_nodes.hpp"
#ifdef STEPGRAPH_HAVE_CUDNN
#include "ops/cuda/conv_cudnn.hpp"
#endif

namespace sg::cuda {
namespace {

NhwcConvPass pass_of(OpKind op) {
  return op == OpKind::conv2d ? NhwcConvPass::forward : NhwcConvPass::backward_data;
}

NhwcConvShape nhwc_shape(const ConvSizes& z) { return {z.n, z.h, z.w, z.c, z.k, z.r, z.s, z.stride, z.padding}; }

// Why a convolution node is not ours ("" when it is).
std::string why_not_node(const sg::Graph& g, const Node& n) {
  if (n.op == OpKind::conv2d_backward_filter) return "a weight gradient (cuDNN or our NCHW kernels run those)";
  if (!is_conv(n.op)) return "not a convolution";
  const DType t = g.value(n.outputs[0]).dtype;
  if (t != DType::f16 && t != DType::bf16) return fmt::format("{} activations (tensor cores take f16 / bf16)", dtype_name(t));
  const ConvSizes z = conv_sizes(g, n);
  if (!z.channels_last) return "NCHW activations";
  return nhwc_conv_why_not(pass_of(n.op), nhwc_shape(z));
}

// With autotune: ours is bound only where it timed below this fraction of cuDNN's time.
constexpr float kMargin = 0.9f;

// The choice autotune made in this process, by problem: a tile, or -1 for cuDNN.
std::mutex chosen_mutex;
std::map<std::string, int>& chosen_tiles() {
  static std::map<std::string, int> tiles;
  return tiles;
}

// Microseconds per run: the median of three timings of 10 runs back to back
// (after one untimed run), GPU time alone (ops/cuda/gpu_timing.hpp): a
// replayed graph pays no host cost per launch, ours or cuDNN's.
template <typename Run>
float median_us(cudaStream_t stream, Run&& run) {
  run(stream);
  return gpu_time_us(stream, 10, 3, run);
}

class TensorCoreConvLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "tensor_core_conv"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    const sg::Graph& g = cover.graph();
    if (!why_not_node(g, g.node(unit.nodes.front())).empty()) return std::nullopt;
    return match_conv(
        cover, unit, [](DType t) { return t == DType::f16 || t == DType::bf16; }, [](const ConvSizes&) { return true; });
  }

  std::string describe(const sg::Graph& g, const Launch& l) const override { return describe_conv(g, l); }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto& nodes = detail_of<ConvNodes>(l);
    const Node& n = g.node(nodes.conv);
    const ConvSizes z = conv_sizes(g, n);
    const NhwcConvPass pass = pass_of(n.op);
    const DType dtype = g.value(n.outputs[0]).dtype;
    Operands o;
    o.input = c.ptr(n.inputs[0]);
    o.filter = c.ptr(n.inputs[1]);
    o.bias = n.inputs.size() == 3 ? c.ptr(n.inputs[2]) : nullptr;
    o.relu = nodes.relu >= 0;
    o.output = c.ptr(g.node(o.relu ? nodes.relu : nodes.conv).outputs[0]);
    // The kernels copy 16 bytes at a time and store channel pairs: the arena's alignment gives both.
    if (reinterpret_cast<std::uintptr_t>(o.input) % 16 != 0 || reinterpret_cast<std::uintptr_t>(o.output) % 4 != 0)
      throw CudaError(fmt::format("tensor_core_conv: node {}'s activations are not 16-byte aligned", n.id));
    const int sms = current_device_attribute(cudaDevAttrMultiProcessorCount);
    // A [K,R,S,C] filter (graph/filter_layout_pass.hpp) is what a forward reads as it is.
    const auto plan_of = [&](int tile) {
      NhwcConvPlan p = plan_nhwc_conv(pass, nhwc_shape(z), tile, sms);
      p.filter_krsc = z.filter_channels_last;
      return p;
    };
    NhwcConvPlan plan = plan_of(-1);
    if (!c.options().autotune) return bind_ours(plan, dtype, o, c, "tile from the shape; backend.autotune times them");

    const std::string key = fmt::format("{}:{}:{}x{}x{}x{}:{}x{}x{}:s{}p{}:b{}r{}f{}", static_cast<int>(pass),
                                        dtype_name(dtype), z.n, z.h, z.w, z.c, z.k, z.r, z.s, z.stride, z.padding,
                                        o.bias != nullptr, o.relu, z.filter_channels_last);
    std::optional<int> chosen;
    {
      const std::lock_guard lock(chosen_mutex);
      if (auto it = chosen_tiles().find(key); it != chosen_tiles().end()) chosen = it->second;
    }
    std::string why = "chosen by timing earlier in this process";
#ifdef STEPGRAPH_HAVE_CUDNN
    std::shared_ptr<const CudnnConv> timed_cudnn;  // kept to bind where it wins
#endif
    if (!chosen) {
      // Every tile on the launch's buffers (the filter rewritten into a buffer of its own here).
      DeviceBuffer rewritten(plan.filter_elements() * 2);
      float best = -1.0f;
      std::string times;
      for (int tile = 0; tile < nhwc_conv_tile_count(); ++tile) {
        const NhwcConvPlan p = plan_of(tile);
        const float us = median_us(c.stream(), [&](cudaStream_t s) { run(p, dtype, o, rewritten.data(), s); });
        times += fmt::format("{}{:.1f}", times.empty() ? "" : " ", us);
        if (best < 0 || us < best) {
          best = us;
          chosen = tile;
        }
      }
      why = fmt::format("fastest tile of {} timed ({} us)", nhwc_conv_tile_count(), times);
#ifdef STEPGRAPH_HAVE_CUDNN
      timed_cudnn = cudnn_conv(n, z, dtype, o, c);
      DeviceBuffer workspace(timed_cudnn->workspace_bytes());
      const float cudnn_us =
          median_us(c.stream(), [&](cudaStream_t s) { timed_cudnn->run(tensors(n, o), workspace.data(), s); });
      why += fmt::format("; cuDNN's fastest engine {:.1f} us", cudnn_us);
      if (!(best < kMargin * cudnn_us)) chosen = -1;
#endif
      const std::lock_guard lock(chosen_mutex);
      chosen_tiles().emplace(key, *chosen);
    }
#ifdef STEPGRAPH_HAVE_CUDNN
    if (*chosen < 0) {
      auto conv = timed_cudnn ? timed_cudnn : cudnn_conv(n, z, dtype, o, c);
      void* const* workspace = c.workspace(conv->workspace_bytes());
      const ConvTensors t = tensors(n, o);
      std::string label = conv->label() + " (kept over ours: " + why + ")";
      return std::make_unique<BoundLaunch>([conv, t, workspace](cudaStream_t s) { conv->run(t, *workspace, s); },
                                           std::move(label));
    }
#endif
    plan = plan_of(std::max(*chosen, 0));
    return bind_ours(plan, dtype, o, c, why);
  }

 private:
  struct Operands {
    const void* input = nullptr;
    const void* filter = nullptr;
    const void* bias = nullptr;
    bool relu = false;
    void* output = nullptr;
  };

  static void run(const NhwcConvPlan& p, DType dtype, const Operands& o, void* rewritten, cudaStream_t s) {
    if (dtype == DType::f16)
      launch_nhwc_conv(p, static_cast<const __half*>(o.input), static_cast<const __half*>(o.filter),
                       static_cast<const __half*>(o.bias), o.relu, static_cast<__half*>(o.output),
                       static_cast<__half*>(rewritten), s);
    else
      launch_nhwc_conv(p, static_cast<const __nv_bfloat16*>(o.input), static_cast<const __nv_bfloat16*>(o.filter),
                       static_cast<const __nv_bfloat16*>(o.bias), o.relu, static_cast<__nv_bfloat16*>(o.output),
                       static_cast<__nv_bfloat16*>(rewritten), s);
  }

  static std::unique_ptr<RecordedLaunch> bind_ours(const NhwcConvPlan& plan, DType dtype, const Operands& o,
                                                   const BindContext& c, const std::string& why) {
    // The shared workspace's address is final once every launch is recorded: read it when enqueuing.
    void* const* workspace = c.workspace(plan.filter_elements() * 2);
    return std::make_unique<BoundLaunch>([plan, dtype, o, workspace](cudaStream_t s) { run(plan, dtype, o, *workspace, s); },
                                         fmt::format("{} ({})", plan.describe(), why));
  }

#ifdef STEPGRAPH_HAVE_CUDNN
  static ConvTensors tensors(const Node& n, const Operands& o) {
    ConvTensors t;
    if (n.op == OpKind::conv2d) {
      t.x = const_cast<void*>(o.input);
      t.y = o.output;
      t.bias = o.bias;
    } else {  // (dY, W) -> dX
      t.y = const_cast<void*>(o.input);
      t.x = o.output;
    }
    t.w = const_cast<void*>(o.filter);
    return t;
  }

  static std::shared_ptr<const CudnnConv> cudnn_conv(const Node& n, const ConvSizes& z, DType dtype,
                                                     const Operands& o, const BindContext& c) {
    ConvRequest request;
    request.io_type = dtype == DType::f16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
    request.geometry = {z.n, z.c, z.h, z.w, z.k, z.r, z.s, z.stride, z.padding};
    request.channels_last = true;
    request.filter_channels_last = z.filter_channels_last;
    request.direction = n.op == OpKind::conv2d ? ConvDirection::forward : ConvDirection::backward_data;
    request.bias = o.bias != nullptr;
    request.relu = o.relu;
    // (cuDNN at its best, knob variants included: the engine the core lowering would bind.)
    return std::make_shared<const CudnnConv>(c.cudnn(), request, tensors(n, o), c.stream(), true,
                                             static_cast<std::size_t>(c.options().cudnn_knob_variants));
  }
#endif
};

}  // namespace

std::string tensor_core_conv_why_not_node(const sg::Graph& g, const Node& n) { return why_not_node(g, n); }

std::unique_ptr<CudaLowering> make_tensor_core_conv_lowering() { return std::make_unique<TensorCoreConvLowering>(); }

}  // namespace sg::cuda
