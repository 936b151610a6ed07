#include "runtime/cuda/activation_layout_choice.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <set>
#include <tuple>

#include "runtime/cuda/fast_paths/fast_path.hpp"
#include "runtime/cuda/lowering.hpp"
#include "runtime/cuda/lowerings/conv_nodes.hpp"

namespace sg::cuda {
namespace {

// A convolution's input and output channels and input size: what names it
// in both forms of the step (node and value ids differ between them).
using ConvKey = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>;
ConvKey conv_key(const ConvSizes& z) { return {z.c, z.k, z.h, z.w}; }

// The convolutions the channels-last step runs on the few-channel
// tensor-core kernels (the few_channel_conv record's launches), forward or backward.
std::set<ConvKey> few_channel_convs(const sg::Graph& channels_last_train,
                                     const std::vector<std::unique_ptr<CudaLowering>>& lowerings,
                                     const BackendOptions& options) {
  const Schedule s = build_schedule(channels_last_train, as_lowerings(lowerings));
  const std::vector<bool> few_channel =
      record_launches(fast_path_named("few_channel_conv"), channels_last_train, s, options);
  std::set<ConvKey> out;
  for (std::size_t i = 0; i < s.launches.size(); ++i) {
    if (!few_channel[i]) continue;
    const Launch& l = s.launches[i];
    for (NodeId id : l.nodes)
      if (const Node& n = channels_last_train.node(id); is_conv(n.op))
        out.insert(conv_key(conv_sizes(channels_last_train, n)));
  }
  return out;
}

// Why the NCHW step should stay NCHW under `auto`, or "": a whole-step
// kernel takes it (its pattern is channels-first), or our NCHW kernels run
// one of its convolutions of several input channels, not a multiple of 8,
// that the channels-last step would not give to the few-channel kernels.
// Measured (H200, docs/benchmarks.md, "Channels-last through dropout2d and
// mean pooling" and "Few-channel kernels for any filter count"): CNNs whose
// such layers read 8 channels ran 25-41% faster a step channels-last, and
// a 1 -> 4 -> 16 CNN 38% faster once the few-channel kernels took its
// 4-filter layer; the report CNN's network with fp16 weights (1 -> 10 ->
// 20, no whole-step kernel) ran 11% slower channels-last (its 10-channel
// layer on cuDNN), but LeNet-5 (1 -> 6 -> 16) 18% faster: the count is a
// proxy, which backend.autotune replaces by timing both forms
// (timed_layout_choice.cpp). A one-channel layer keeps our weight gradient
// (it reads channels-last dY).
std::string nchw_reason(const TrainingProgram& program, const BackendOptions& options, bool device_present) {
  const sg::Graph& train = program.train;
  const auto lowerings = cuda_lowerings(options, device_present);
  const Schedule s = build_schedule(train, as_lowerings(lowerings));
  // (In a data-parallel rank the fused CNN step leaves the all-reduces and
  // updates to launches of their own: any launch, not only a lone one. The
  // lone-launch test sent the report CNN's rank channels-last, which the
  // fused step's pattern does not take.)
  if (std::any_of(s.launches.begin(), s.launches.end(),
                  [](const Launch& l) { return cuda_lowering_of(l).covers_whole_step(); }))
    return "a whole-step kernel takes the NCHW step";
  std::optional<std::set<ConvKey>> few;  // built on the first candidate: a second schedule
  for (const Launch& l : s.launches) {
    if (l.lowering->name() != "conv_implicit_gemm") continue;
    for (NodeId id : l.nodes) {
      const Node& n = train.node(id);
      if (!is_conv(n.op)) continue;
      const ConvSizes z = conv_sizes(train, n);
      if (z.c <= 1 || z.c % 8 == 0) continue;
      if (!few) few = few_channel_convs(program.channels_last->train, lowerings, options);
      if (few->count(conv_key(z)) == 0)
        return fmt::format("our kernels run the {}-channel {} in NCHW, measured faster than cuDNN there", z.c,
                           op_name(n.op));
    }
  }
  return "";
}

void use_channels_last(TrainingProgram& p) {
  ChannelsLastVariant& v = *p.channels_last;
  p.train = std::move(v.train);
  p.train_data = v.train_data;
  p.eval = std::move(v.eval);
  p.eval_data = v.eval_data;
  p.channels_last.reset();
}

}  // namespace

std::string cudnn_missing() {
#ifndef STEPGRAPH_HAVE_CUDNN
  return "channels-last convolutions run through cuDNN, which this build lacks";
#else
  return "";
#endif
}

std::string auto_layout_nchw_reason(const TrainingProgram& program, const BackendOptions& options,
                                    bool device_present) {
  if (!program.channels_last) return "no convolution layers";
  if (std::string why = cudnn_missing(); !why.empty()) return why;
  if (const int exits = program.channels_last->inner_exits; exits > 0)
    return fmt::format("{} channels-last region(s) end inside the network (a layer without a channels-last kernel)",
                       exits);
  return nchw_reason(program, options, device_present);
}

std::string choose_activation_layout(TrainingProgram& program, const BackendOptions& options, bool device_present) {
  if (!program.channels_last) return "NCHW (no convolution layers)";
  const ActivationLayout asked = options.activation_layout;
  std::string why = asked == ActivationLayout::automatic ? auto_layout_nchw_reason(program, options, device_present)
                                                         : cudnn_missing();
  if (why.empty() && asked == ActivationLayout::nchw) why = "backend.activation_layout: nchw";
  if (!why.empty()) {
    program.channels_last.reset();
    return "NCHW (" + why + ")";
  }
  // A batch_norm stays inside a region on the [N*H*W, C] rows kernel: on
  // mnist_resnet's seven, channels-last is 583 us a step against 667 NCHW
  // (H200, docs/benchmarks.md), so auto no longer keeps NCHW for them.
  const int norms = program.channels_last->batch_norms;
  use_channels_last(program);
  std::string how = asked == ActivationLayout::channels_last ? "backend.activation_layout: channels_last"
                                                             : "its regions end at flattens or the global pooling";
  if (norms > 0) how += fmt::format("; {} batch_norm layer(s) on the [N*H*W, C] rows kernel", norms);
  return "channels-last (" + how + ")";
}

TrainerSpec with_activation_layout(TrainerSpec spec, bool device_present, std::string& choice) {
  choice = choose_activation_layout(spec.program, spec.backend, device_present);
  return spec;
}

}  // namespace sg::cuda
