#pragma once
// What a few-channel forward launch (few_channel_conv.cpp) takes beside its
// convolution when the convolution is the network's first layer: the
// step's batch fetch, where the gathered images reach the convolution's
// input through views only (one channel: the NCHW batch is channels-last
// already), and the casts of its fp32 master filter and bias, where the
// launch is their only reader. Then the first launch of the step is the
// convolution itself: no fetch launch before it, and it waits for no
// parameter cast (cast_params runs beside it on the gradient stream).
// The kernel reads the dataset's u8 rows and the fp32 values and rounds
// both as batch_fetch and the cast kernel do (FewChannelFetch,
// FewChannelForwardArgs::params_f32): the same bits.
#include <vector>

#include "ops/cuda/fast_paths/few_channel_conv/few_channel_conv.hpp"
#include "runtime/cuda/lowering.hpp"
#include "runtime/cuda/lowerings/fetch_nodes.hpp"

namespace sg::cuda {

struct FirstLayerInputs {
  FetchNodes fetch;                         // the batch fetch, when taken
  std::vector<NodeId> views;                // between the gathered images and the input, in order
  NodeId weight_cast = -1, bias_cast = -1;  // the master parameters' casts, when taken
  bool fetches() const { return fetch.indices >= 0; }
};

// Takes what it can for the convolution `conv` into `m` (its units, the
// views' aliases, and the launch's place: the convolution's unit
// `conv_unit`, after the casts it does not take).
FirstLayerInputs take_first_layer_inputs(const Cover& cover, const Node& conv, int conv_unit, Match& m);

// The launch's arguments for what was taken: the fetch's tables and
// outputs, the parameters read as fp32; the rest as the convolution reads them.
FewChannelForwardArgs bind_first_layer_inputs(const FirstLayerInputs& in, const Node& conv, const Launch& l,
                                              const BindContext& c);

}  // namespace sg::cuda
