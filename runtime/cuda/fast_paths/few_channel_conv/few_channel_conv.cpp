// Lowerings of fast path few_channel_conv (its record:
// few_channel_conv_record.cpp): a channels-last f16 / bf16 convolution of
// few input channels (an image network's first layer) by our tensor-core
// kernels (ops/cuda/fast_paths/few_channel_conv/):
//   few_channel_conv:  the forward [+ bias] [+ the relu after it] [+ the
//     step's batch fetch and the master parameters' casts before it, where it
//     is the first layer: first_layer_inputs.hpp];
//   few_channel_wgrad: the weight gradient, with the bias gradient of the
//     same dY (and its cast) in the same pass where the graph has one
//     (conv_bias_gradient.hpp), else alone; and the backward of the
//     activation after the convolution, where only this launch reads its
//     output (its kernel stages dY through it: no launch, no buffer).
// Its data gradient, where the graph has one (a first layer's input needs
// none), stays with the core's convolutions.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <memory>

#include "ops/cuda/fast_paths/few_channel_conv/few_channel_conv.hpp"
#include "runtime/cuda/fast_paths/few_channel_conv/first_layer_inputs.hpp"
#include "runtime/cuda/lowerings/activation_nodes.hpp"
#include "runtime/cuda/lowerings/conv_bias_gradient.hpp"
#include "runtime/cuda/lowerings/lone_units.hpp"

namespace sg::cuda {

FewChannelConvShape few_channel_shape(const ConvSizes& z) {
  return {z.n, z.h, z.w, z.c, z.k, z.r, z.s, z.stride, z.padding};
}

namespace {

bool half_type(DType t) { return t == DType::f16 || t == DType::bf16; }

// "" when these kernels take a convolution of sizes z (its dtype checked apart).
std::string few_channel_sizes_why_not(const ConvSizes& z) {
  if (!z.channels_last) return "NCHW activations (these kernels take channels-last)";
  if (!filter_bytes_kcrs(z)) return "a [K,R,S,C] filter (these kernels read [K,C,R,S])";
  return few_channel_conv_why_not(few_channel_shape(z));
}

}  // namespace

// "" when these kernels take a convolution of `t` with sizes z.
std::string few_channel_why_not(const ConvSizes& z, DType t) {
  if (!half_type(t)) return fmt::format("{} activations (these kernels take f16 / bf16)", dtype_name(t));
  return few_channel_sizes_why_not(z);
}

namespace {

// The forward's nodes: the convolution [+ relu], and what it takes before it.
struct FewChannelForwardNodes {
  ConvNodes conv;
  FirstLayerInputs inputs;
};

class FewChannelForwardLowering final : public CudaLowering {
 public:
  std::string_view name() const override { return "few_channel_conv"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    const Node& conv = cover.graph().node(unit.nodes.front());
    if (conv.op != OpKind::conv2d) return std::nullopt;
    auto m =
        match_conv(cover, unit, half_type, [](const ConvSizes& z) { return few_channel_sizes_why_not(z).empty(); });
    if (!m) return std::nullopt;
    FewChannelForwardNodes nodes{std::any_cast<ConvNodes>(m->detail), {}};
    nodes.inputs = take_first_layer_inputs(cover, conv, unit.id, *m);
    m->detail = nodes;
    return m;
  }

  std::string describe(const sg::Graph& g, const Launch& l) const override {
    const auto& nodes = detail_of<FewChannelForwardNodes>(l);
    return describe_conv(g, nodes.conv) + (nodes.inputs.fetches() ? ",+batch fetch" : "") +
           (nodes.inputs.weight_cast >= 0 ? ",+fp32 parameters' casts" : "");
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto& nodes = detail_of<FewChannelForwardNodes>(l);
    const Node& n = g.node(nodes.conv.conv);
    const FewChannelForwardPlan plan = plan_few_channel_forward(
        few_channel_shape(conv_sizes(g, n)), current_device_attribute(cudaDevAttrMultiProcessorCount));
    FewChannelForwardArgs args = bind_first_layer_inputs(nodes.inputs, n, l, c);
    args.relu = nodes.conv.relu >= 0;
    args.y = c.ptr(g.node(args.relu ? nodes.conv.relu : nodes.conv.conv).outputs[0]);
    std::function<void(cudaStream_t)> run;
    with_float_type(g.value(n.outputs[0]).dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, float>)
        run = [=](cudaStream_t s) { launch_few_channel_forward<T>(plan, args, s); };
    });
    if (!run) throw CudaError("few_channel_conv: f16 / bf16 only");
    return std::make_unique<BoundLaunch>(std::move(run), plan.describe());
  }
};

// The nodes of a weight-gradient launch: the weight gradient, the bias
// gradient's sum and cast where taken (with_bias), and the activation
// backward whose output dY is, where the launch computes it while staging.
struct FewChannelWgradNodes {
  WgradBiasNodes wgrad;
  NodeId gate = -1;
};

// The free lone activation-backward node producing the weight gradient's dY
// when only this launch reads dY (the weight gradient, and the view the bias
// sum reads, itself read by nothing else), in dY's dtype; with the view's
// unit. Not after a max-pooling's backward (see below).
struct GateUnits {
  NodeId backward = -1;
  std::vector<int> units;
};
std::optional<GateUnits> activation_gate(const Cover& cover, const Node& wgrad, NodeId sum) {
  const sg::Graph& g = cover.graph();
  const Value& dy = g.value(wgrad.inputs[0]);
  const CoverUnit* bw = free_lone_unit(cover, dy.producer);
  if (!bw || !backward_activation(g.node(dy.producer).op) || is_graph_output(g, dy.id)) return std::nullopt;
  if (!few_channel_wgrad_gate_fits(few_channel_shape(conv_sizes(g, wgrad)))) return std::nullopt;
  const Node& b = g.node(dy.producer);
  // A max-pooling's backward writes the activation's gradient in its own
  // pass (max_pool2d_backward.cpp: a ReLU's, and any activation's when
  // channels-last, as here); staged here instead, the pooling would write
  // its gradient and this launch read it back with the saved value.
  const NodeId incoming = g.value(b.inputs[0]).producer;
  if (incoming >= 0 && g.node(incoming).op == OpKind::max_pool2d_backward) return std::nullopt;
  for (ValueId in : b.inputs)
    if (g.value(in).dtype != dy.dtype || g.value(in).shape != dy.shape) return std::nullopt;
  GateUnits gate{b.id, {bw->id}};
  for (NodeId r : g.consumers(dy.id)) {
    if (r == wgrad.id) continue;
    // (the [N*H*W, C] view the channels-last bias sum reads)
    const Node& view = g.node(r);
    const CoverUnit* vu = free_lone_unit(cover, r);
    if (sum < 0 || !vu || view.op != OpKind::reshape || is_graph_output(g, view.outputs[0])) return std::nullopt;
    const auto& readers = g.consumers(view.outputs[0]);
    if (readers.size() != 1 || readers[0] != sum) return std::nullopt;
    gate.units.push_back(vu->id);
  }
  return gate;
}

// with_bias: the bias-gradient unit with its weight gradient (slot
// backward_patterns, ahead of column_sum); else a lone weight gradient.
// Either takes the activation backward before them (activation_gate).
class FewChannelWgradLowering final : public CudaLowering {
 public:
  explicit FewChannelWgradLowering(bool with_bias) : with_bias_(with_bias) {}

  std::string_view name() const override { return "few_channel_wgrad"; }

  std::optional<Match> match(const Cover& cover, const CoverUnit& unit) const override {
    const sg::Graph& g = cover.graph();
    std::optional<Match> m;
    FewChannelWgradNodes nodes;
    if (with_bias_) {
      m = match_wgrad_bias(cover, unit, [](const ConvSizes& z, DType t) { return few_channel_why_not(z, t).empty(); });
      if (!m) return std::nullopt;
      nodes.wgrad = std::any_cast<WgradBiasNodes>(m->detail);
    } else {
      if (g.node(unit.nodes.front()).op != OpKind::conv2d_backward_filter) return std::nullopt;
      m = match_conv(cover, unit, half_type, [](const ConvSizes& z) { return few_channel_sizes_why_not(z).empty(); });
      if (!m) return std::nullopt;
      nodes.wgrad.wgrad = unit.nodes.front();
    }
    if (auto gate = activation_gate(cover, g.node(nodes.wgrad.wgrad), nodes.wgrad.sum)) {
      nodes.gate = gate->backward;
      m->units.insert(m->units.end(), gate->units.begin(), gate->units.end());
    }
    m->detail = nodes;
    return m;
  }

  std::string describe(const sg::Graph& g, const Launch& l) const override {
    const auto& nodes = detail_of<FewChannelWgradNodes>(l);
    const auto& a = g.node(nodes.wgrad.wgrad).attr<Conv2dAttrs>();
    return fmt::format("{}wgrad{}{},stride={},padding={}{}",
                       nodes.gate >= 0 ? fmt::format("{}+", op_name(g.node(nodes.gate).op)) : "",
                       nodes.wgrad.sum >= 0 ? "+bias" : "", nodes.wgrad.cast >= 0 ? "+cast" : "", a.stride, a.padding,
                       a.channels_last ? ",channels_last" : "");
  }

  std::unique_ptr<RecordedLaunch> record(const Launch& l, std::size_t, const BindContext& c) const override {
    const sg::Graph& g = c.graph();
    const auto& nodes = detail_of<FewChannelWgradNodes>(l);
    const Node& w = g.node(nodes.wgrad.wgrad);
    const bool widened = nodes.wgrad.cast >= 0;
    const NodeId bias_node = widened ? nodes.wgrad.cast : nodes.wgrad.sum;
    // Gated: dY is the launch's own (no buffer); it reads the activation backward's inputs instead.
    std::optional<Activation> gate;
    const void* dy = nullptr;
    const void* saved = nullptr;
    if (nodes.gate >= 0) {
      const Node& b = g.node(nodes.gate);
      gate = backward_activation(b.op);
      dy = c.ptr(b.inputs[0]);
      saved = c.ptr(b.inputs[1]);
    } else {
      dy = c.ptr(w.inputs[0]);
    }
    auto kernel = std::make_shared<const FewChannelWgrad>(few_channel_shape(conv_sizes(g, w)), with_bias_,
                                                          current_device_attribute(cudaDevAttrMultiProcessorCount), 0,
                                                          gate);
    const void* x = c.ptr(w.inputs[1]);
    void* dw = c.ptr(w.outputs[0]);
    void* db = bias_node >= 0 ? c.ptr(g.node(bias_node).outputs[0]) : nullptr;
    std::function<void(cudaStream_t)> run;
    with_float_type(g.value(w.outputs[0]).dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, float>) {
        const T* dyt = static_cast<const T*>(dy);
        const T* xt = static_cast<const T*>(x);
        const T* savedt = static_cast<const T*>(saved);
        T* dwt = static_cast<T*>(dw);
        if (widened)
          run = [=](cudaStream_t s) { kernel->run(dyt, xt, dwt, static_cast<float*>(db), s, savedt); };
        else
          run = [=](cudaStream_t s) { kernel->run(dyt, xt, dwt, static_cast<T*>(db), s, savedt); };
      }
    });
    if (!run) throw CudaError("few_channel_wgrad: f16 / bf16 only");
    return std::make_unique<BoundLaunch>(std::move(run), kernel->describe());
  }

 private:
  bool with_bias_;
};

}  // namespace

std::unique_ptr<CudaLowering> make_few_channel_forward_lowering() { return std::make_unique<FewChannelForwardLowering>(); }
std::unique_ptr<CudaLowering> make_few_channel_wgrad_lowering(bool with_bias) {
  return std::make_unique<FewChannelWgradLowering>(with_bias);
}

}  // namespace sg::cuda
