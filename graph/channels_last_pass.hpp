#pragma once
// Channels-last activations: a forward graph rewritten so that convolutions
// and max-poolings (and the element-wise ops between them) work on
// [N,H,W,C] values, the layout cuDNN's fastest convolution engines read and
// write (NCHW costs them a transpose each way: docs/benchmarks.md). Autodiff
// then gives the backward ops the same layout (conv2d's gradients carry its
// attribute; to_channels_last and to_channels_first are each other's
// gradients).
//
// A conv2d takes its input channels-last, converted by to_channels_last where
// it was channels-first (a view when C = 1, as an image input); a max_pool2d,
// an avg_pool2d, a dropout2d, the batch_norm ops (BatchNormAttrs::channels_last:
// BatchNorm1d over the [N*H*W, C] rows) and the element-wise ops listed in
// the .cpp stay channels-last when their input is; every other reader gets
// the value back channels-first (to_channels_first, once per value).
// Parameters keep their shapes, values keep their names, graph outputs their
// layouts: only the order of the activations' elements changes.
#include <optional>

#include "graph/graph.hpp"

namespace sg {

struct ChannelsLastRewrite {
  Graph graph;
  int convolutions = 0;  // conv2d nodes now channels-last
  // to_channels_last / to_channels_first nodes that move data (not a C = 1
  // or 1x1 view), and of them those that feed anything but a flatten or
  // the global average pooling where a region starts again after them (a
  // region that ends inside the network: a transpose each way, e.g. at a
  // dropout between convolutions; one before the flatten converts once, as
  // the flatten does, and is not counted).
  int copies = 0;
  int inner_exits = 0;
  int batch_norms = 0;  // batch_norm nodes now channels-last
};

// Whether converting `channels` channels of `plane` pixels between the two
// layouts keeps the order of the elements (one channel, or a 1x1 plane): a
// view, no data moved.
inline bool layout_conversion_is_view(std::int64_t channels, std::int64_t plane) {
  return channels == 1 || plane == 1;
}

// The rewrite of a forward graph (no fusion groups), or nullopt when it has
// no conv2d over a 4-D value.
std::optional<ChannelsLastRewrite> rewrite_channels_last(const Graph& forward);

}  // namespace sg
