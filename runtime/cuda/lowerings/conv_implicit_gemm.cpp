// Lowering: a conv2d [+ the relu right after it], a conv2d_backward_data or a
// conv2d_backward_filter node by our implicit-GEMM kernels
// (ops/cuda/conv_implicit_gemm.hpp): the alternative to conv_cudnn for the
// tiny convolutions of small CNNs, where a library call's fixed costs can
// dominate. cuda_lowerings() ranks it before or after conv_cudnn by
// backend.conv_kernels; in `auto` one instance limited to input x output
// channels <= kOursMaxChannelProduct comes first (registry.cpp says why)
// (tests/kernels/test_cnn_kernels.cpp builds it directly).
// The split-K partials (and the direct weight gradient's per-block partials)
// live in the program's shared workspace.
#include "ops/cuda/conv_implicit_gemm.hpp"

#include "runtime/cuda/lowerings/conv_nodes.hpp"

namespace sg::cuda {
namespace {

ConvPass pass_of(OpKind op) {
  if (op == OpKind::conv2d) return ConvPass::forward;
  return op == OpKind::conv2d_backward_data ? ConvPass::backward_data : ConvPass::backward_filter;
}

bool is_filter_gradient(const Cover& cover, const CoverUnit& unit) {
  return cover.graph().node(unit.nodes.front()).op == OpKind::conv2d_backward_filter;
}

class ConvImplicitGemmLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "conv_implicit_gemm"; }

  explicit ConvImplicitGemmLowering(std::int64_t max_channel_product) : max_channel_product_(max_channel_product) {}

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    return match_conv(
        cover, unit, [](DType t) { return is_floating(t); },
        [&](const ConvSizes& z) {
          // Our kernels read and write NCHW activations and [K,C,R,S] filters;
          // channels-last, the weight gradient of a one-channel input (X's
          // bytes, and a [K,R,S,C] filter's, are the same).
          const bool layout = (!z.channels_last && !z.filter_channels_last) ||
                              (z.channels_last && is_filter_gradient(cover, unit) && z.c == 1);
          return layout && (max_channel_product_ == 0 || z.c * z.k <= max_channel_product_);
        });
  }

  std::string describe(const sg::Graph& g, const Launch& l) const override { return describe_conv(g, l); }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto& nodes = detail_of<ConvNodes>(l);
    const Node& n = g.node(nodes.conv);
    const ImplicitGemmPlan plan = plan_implicit_gemm(pass_of(n.op), implicit_gemm_shape(conv_sizes(g, n)),
                                                     current_device_attribute(cudaDevAttrMultiProcessorCount));
    // The shared workspace's address is final once every launch is recorded: read it when enqueuing.
    static void* const kNoWorkspace = nullptr;
    void* const* workspace = plan.workspace_bytes() > 0 ? c.workspace(plan.workspace_bytes()) : &kNoWorkspace;
    const void* in0 = c.ptr(n.inputs[0]);
    const void* in1 = c.ptr(n.inputs[1]);
    const void* bias = n.inputs.size() == 3 ? c.ptr(n.inputs[2]) : nullptr;
    const bool relu = nodes.relu >= 0;
    void* out = c.ptr(g.node(relu ? nodes.relu : nodes.conv).outputs[0]);
    std::function<void(cudaStream_t)> run;
    with_float_type(g.value(n.outputs[0]).dtype, [&](auto tag) {
      using T = decltype(tag);
      const T* a = static_cast<const T*>(in0);
      const T* b = static_cast<const T*>(in1);
      T* y = static_cast<T*>(out);
      switch (plan.pass) {
        case ConvPass::forward:
          run = [=](cudaStream_t s) {
            launch_conv_forward(plan, a, b, static_cast<const T*>(bias), relu, y, static_cast<float*>(*workspace), s);
          };
          break;
        case ConvPass::backward_data:
          run = [=](cudaStream_t s) { launch_conv_backward_data(plan, a, b, y, static_cast<float*>(*workspace), s); };
          break;
        case ConvPass::backward_filter:
          run = [=](cudaStream_t s) { launch_conv_backward_filter(plan, a, b, y, static_cast<float*>(*workspace), s); };
      }
    });
    return std::make_unique<BoundLaunch>(std::move(run), describe_plan(plan));
  }

 private:
  std::int64_t max_channel_product_;  // 0: any convolution
};

}  // namespace

std::unique_ptr<CudaLowering> make_conv_implicit_gemm_lowering(std::int64_t max_channel_product) {
  return std::make_unique<ConvImplicitGemmLowering>(max_channel_product);
}

}  // namespace sg::cuda
