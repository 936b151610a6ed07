#include "runtime/cuda/activation_layout_choice.hpp"

#include <fmt/format.h>

#include "runtime/cuda/lowering.hpp"
#include "runtime/cuda/lowerings/conv_nodes.hpp"

namespace sg::cuda {
namespace {

// Why the NCHW step should stay NCHW under `auto`, or "": a whole-step
// kernel takes it (its pattern is channels-first), or our NCHW kernels run
// one of its convolutions of several input channels, not a multiple of 8.
// Measured (H200, docs/benchmarks.md, "Channels-last through dropout2d and
// mean pooling"): CNNs whose such layers read 8 channels ran 25-41% faster
// a step channels-last; LeNet-5 (1 -> 6 -> 16) ran 17% slower, its first
// layer's 6 filters being too few for the few-channel kernels (multiples of
// 8), so its weight gradient and bias sums fell back to slow launches. The
// count is a proxy: a 1 -> 4 -> 16 CNN kept NCHW by it ran 27% faster
// channels-last. A one-channel layer keeps our weight gradient (it reads
// channels-last dY).
std::string nchw_reason(const sg::Graph& train, const BackendOptions& options, bool device_present) {
  const auto lowerings = cuda_lowerings(options, device_present);
  const Schedule s = build_schedule(train, as_lowerings(lowerings));
  if (s.launches.size() == 1 && cuda_lowering_of(s.launches[0]).covers_whole_step())
    return "a whole-step kernel takes the NCHW step";
  for (const Launch& l : s.launches) {
    if (l.lowering->name() != "conv_implicit_gemm") continue;
    for (NodeId id : l.nodes) {
      const Node& n = train.node(id);
      if (const std::int64_t c = is_conv(n.op) ? conv_sizes(train, n).c : 1; c > 1 && c % 8 != 0)
        return fmt::format("our kernels run the {}-channel {} in NCHW, measured faster than cuDNN there", c,
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

std::string choose_activation_layout(TrainingProgram& program, const BackendOptions& options, bool device_present) {
  if (!program.channels_last) return "NCHW (no convolution layers)";
  std::string why;
#ifndef STEPGRAPH_HAVE_CUDNN
  why = "channels-last convolutions run through cuDNN, which this build lacks";
#endif
  const ActivationLayout asked = options.activation_layout;
  const int exits = program.channels_last->inner_exits;
  if (why.empty() && asked == ActivationLayout::nchw) why = "backend.activation_layout: nchw";
  if (why.empty() && asked == ActivationLayout::automatic) {
    if (exits > 0)
      why = fmt::format("{} channels-last region(s) end inside the network (a layer without a channels-last kernel)",
                        exits);
    else
      why = nchw_reason(program.train, options, device_present);
  }
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
