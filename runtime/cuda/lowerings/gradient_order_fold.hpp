#pragma once
// The update launches (update_multi_tensor, sgd_multi_tensor) take in the
// to_channels_first that turns a channels-last weight gradient [O,KH,KW,C]
// (graph/filter_layout_pass.hpp) back into its parameter's [O,C,KH,KW]: they
// read the gradient as the weight gradient wrote it, in the parameter's order
// through ops/cuda/gradient_order.hpp, so the transpose is no launch (cuDNN's
// own, inside its call, was one kernel more).
#include <string_view>

#include <fmt/format.h>

#include "ops/cuda/cuda_check.hpp"
#include "ops/cuda/gradient_order.hpp"
#include "runtime/cuda/lowerings/lone_units.hpp"

namespace sg::cuda {

// The to_channels_first node producing `value` when it is a free lone unit and
// `reader` is the value's only reader; else -1. (GradientOrder's index
// arithmetic is 32-bit: a larger filter keeps its own transpose launch.)
inline NodeId folded_gradient_order(const Cover& cover, ValueId value, NodeId reader) {
  const sg::Graph& g = cover.graph();
  const NodeId producer = g.value(value).producer;
  if (producer < 0 || g.node(producer).op != OpKind::to_channels_first || !free_lone_unit(cover, producer)) return -1;
  if (element_count(g.value(value).shape) >= (std::int64_t(1) << 31)) return -1;
  return sole_reader(g, value) == reader ? producer : -1;
}

// What an update launch reads for gradient `grad`: the input of its folded
// to_channels_first `permute`, else of its folded cast `cast`, else `grad`
// itself (-1: none folded).
inline ValueId gradient_read(const sg::Graph& g, ValueId grad, NodeId cast, NodeId permute) {
  if (permute >= 0) return g.node(permute).inputs[0];
  return cast >= 0 ? g.node(cast).inputs[0] : grad;
}

// How update node `update` of lowering `who` reads the input of
// to_channels_first node `permute` (-1: as it is), updating `count` of its
// parameter's `elements`: a permuted gradient only whole (a shard's range of
// [O,C,KH,KW] is no range of [O,KH,KW,C]).
inline GradientOrder gradient_order(const sg::Graph& g, NodeId permute, std::int64_t count, std::int64_t elements,
                                    std::string_view who, NodeId update) {
  if (permute < 0) return {};
  if (count != elements)
    throw CudaError(fmt::format("{}: node {} reads a permuted gradient in a shard", who, update));
  const Shape& s = g.value(g.node(permute).inputs[0]).shape;  // [O,KH,KW,C]
  return {static_cast<std::int32_t>(s[3]), static_cast<std::int32_t>(s[1] * s[2])};
}

}  // namespace sg::cuda
