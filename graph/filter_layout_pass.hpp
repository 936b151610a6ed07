#pragma once
// Channels-last convolutions read their filters channels-last: [O,KH,KW,C].
//
// cuDNN's channels-last engines read the filter as [K,R,S,C]; given the
// parameter's [O,C,KH,KW] they transpose it in a kernel of their own inside
// every forward and data-gradient call (~3 us each on an H200 at the shipped
// CNNs' sizes: docs/performance.md). This pass gives each such filter ONE
// copy in that layout a step (a to_channels_last node, the activations' layout
// op, right before the filter's first convolution) and has the convolutions
// that read the filter read it (Conv2dAttrs::filter_channels_last). The copy
// depends on the parameters alone, so the CUDA program runs it beside the
// forward's first layers (runtime/cuda/stream_plan.hpp).
//
// The model builder runs it on the channels-last FORWARD graph, before
// autodiff: the conv's gradients then carry the attribute, so the data
// gradient reads the copy and the weight gradient writes [O,KH,KW,C] too
// (cuDNN's transpose after its filter gradient gone as well), and the copy's
// gradient, a to_channels_first, turns it back into the parameter's layout;
// the update launches read it through that order instead of running it
// (runtime/cuda/lowerings/gradient_order_fold.hpp). On a training graph (after
// autodiff) it changes only the forward and data-gradient convolutions.
//
// Runs before fusion. Filters of fewer than `min_channels` input channels
// keep their layout: our few-channel first-layer kernels read [O,C,KH,KW]
// (with one channel both layouts are the same bytes anyway).
#include <cstdint>

#include "graph/graph.hpp"

namespace sg {

inline constexpr std::int64_t kChannelsLastFilterMinChannels = 8;

// Returns how many filters now have a channels-last copy.
int use_channels_last_filters(Graph& graph, std::int64_t min_channels = kChannelsLastFilterMinChannels);

}  // namespace sg
