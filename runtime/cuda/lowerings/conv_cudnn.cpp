// Lowering: a conv2d [+ the relu right after it], a conv2d_backward_data or a
// conv2d_backward_filter node by cuDNN's graph API (ops/cuda/conv_cudnn.hpp).
// The record step builds the cuDNN plan and picks a deterministic engine (the
// heuristics' first, or with backend.autotune the fastest by timing on the
// launch's own buffers); the plan's workspace is the program's shared one
// (BindContext::workspace).
// The bias rides in the forward's cuDNN graph when cuDNN fuses it, and the
// ReLU with it; a relu is taken only when nothing but it reads the conv.
#include "ops/cuda/conv_cudnn.hpp"
#include "runtime/cuda/lowerings/conv_nodes.hpp"

namespace sg::cuda {
namespace {

std::optional<cudnnDataType_t> cudnn_type(DType dtype) {
  switch (dtype) {
    case DType::f16: return CUDNN_DATA_HALF;
    case DType::bf16: return CUDNN_DATA_BFLOAT16;
    case DType::f32: return CUDNN_DATA_FLOAT;
    default: return std::nullopt;
  }
}

class ConvCudnnLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "conv_cudnn"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    return match_conv(
        cover, unit, [](DType t) { return cudnn_type(t).has_value(); }, [](const ConvSizes&) { return true; });
  }

  std::string describe(const sg::Graph& g, const Launch& l) const override { return describe_conv(g, l); }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto& nodes = detail_of<ConvNodes>(l);
    const Node& n = g.node(nodes.conv);
    ConvRequest request;
    request.io_type = *cudnn_type(g.value(n.outputs[0]).dtype);
    const ConvSizes z = conv_sizes(g, n);
    request.geometry = {z.n, z.c, z.h, z.w, z.k, z.r, z.s, z.stride, z.padding};
    request.channels_last = z.channels_last;
    request.filter_channels_last = z.filter_channels_last;
    ConvTensors t;
    switch (n.op) {
      case OpKind::conv2d:
        request.direction = ConvDirection::forward;
        t.x = c.ptr(n.inputs[0]);
        t.w = c.ptr(n.inputs[1]);
        t.y = c.ptr(g.node(nodes.relu >= 0 ? nodes.relu : nodes.conv).outputs[0]);
        if (n.inputs.size() == 3) {
          request.bias = true;
          t.bias = c.ptr(n.inputs[2]);
        }
        request.relu = nodes.relu >= 0;
        break;
      case OpKind::conv2d_backward_data:  // (dY, W) -> dX
        request.direction = ConvDirection::backward_data;
        t.y = c.ptr(n.inputs[0]);
        t.w = c.ptr(n.inputs[1]);
        t.x = c.ptr(n.outputs[0]);
        break;
      default:  // conv2d_backward_filter: (dY, X) -> dW
        request.direction = ConvDirection::backward_filter;
        t.y = c.ptr(n.inputs[0]);
        t.x = c.ptr(n.inputs[1]);
        t.w = c.ptr(n.outputs[0]);
    }
    auto conv = std::make_shared<const CudnnConv>(c.cudnn(), request, t, c.stream(), c.options().autotune,
                                                  static_cast<std::size_t>(c.options().cudnn_knob_variants));
    void* const* workspace = c.workspace(conv->workspace_bytes());
    std::string label = conv->label();
    return std::make_unique<BoundLaunch>([conv, t, workspace](cudaStream_t s) { conv->run(t, *workspace, s); },
                                         std::move(label));
  }
};

}  // namespace

std::unique_ptr<CudaLowering> make_conv_cudnn_lowering() { return std::make_unique<ConvCudnnLowering>(); }

}  // namespace sg::cuda
