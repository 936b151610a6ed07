#pragma once
// Which nodes make a classifier head (fast path classifier_head): the loss
// (softmax_xent and its backward), the linear layer giving the logits, the
// global average pool before it (with its layout conversion and flatten),
// and the data gradient dlogits W with the pool's backward chain. Found from
// the loss's unit; the data gradient and the backward chain are optional.
#include <optional>
#include <string>
#include <vector>

#include "ops/cuda/fast_paths/classifier_head/classifier_head.hpp"
#include "runtime/plan/schedule.hpp"

namespace sg::cuda {

struct HeadNodes {
  NodeId xent = -1, xent_backward = -1;  // loss, dlogits
  NodeId matmul = -1, bias_add = -1;     // logits = X W^T [+ b]
  NodeId dgrad = -1;                     // dX = dlogits W
  NodeId to_first = -1, pool = -1, flatten = -1;            // X = flatten(pool([to_channels_first](A)))
  NodeId grad_reshape = -1, pool_backward = -1, to_last = -1;  // and dX back to A's layout
  ClassifierHeadShape shape;
  std::vector<int> units;  // the offered unit first
};

// The head the offered unit (the one holding softmax_xent) starts, or why not.
// `shape` is filled; the caller asks the kernel whether it takes it.
std::optional<HeadNodes> find_classifier_head(const Cover& cover, const CoverUnit& unit, std::string* why_not);

}  // namespace sg::cuda
